// Package pipeline runs a classified, decided request: it makes the route
// Plan, reserves the plan's worst case, and executes the plan's strategy —
// single with fallback, cascade, mixture, governed-tool loop — as small
// functions over one attempt mechanism (attempt.go), delivering the answer
// through one deliver and one deliverStream (deliver.go). Every request it
// derives (a tool round) is classified and decided again.
package pipeline

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/molly-gateway/molly/policies"
	"github.com/molly-gateway/molly/router/classify"
	"github.com/molly-gateway/molly/router/egress"
	"github.com/molly-gateway/molly/router/health"
	"github.com/molly-gateway/molly/router/identity"
	"github.com/molly-gateway/molly/router/meter"
	"github.com/molly-gateway/molly/router/openai"
	"github.com/molly-gateway/molly/router/route"
)

// Response headers Molly adds to every routed answer.
const (
	HeaderTier       = "X-Molly-Tier"
	HeaderTarget     = "X-Molly-Target"
	HeaderDecisionID = "X-Molly-Decision-Id"
	HeaderRoute      = route.HeaderRoute
	HeaderPlan       = "X-Molly-Strategy"
)

// MaxUpstreamBody bounds a non-streaming upstream answer (64 MiB).
const MaxUpstreamBody = 64 << 20

// DefaultFirstEventTimeout bounds the wait for a stream's first content
// event once its headers arrived; past it the attempt fails and falls back.
const DefaultFirstEventTimeout = 30 * time.Second

// Policy is the policy engine as the pipeline uses it (*policies.Engine).
type Policy interface {
	Decide(ctx context.Context, in policies.Input) policies.Decided
	DecideTool(ctx context.Context, input map[string]any) policies.ToolDecision
	DecideToolOffer(ctx context.Context, input map[string]any) policies.ToolDecision
	DecideEscalation(ctx context.Context, input map[string]any) policies.EscalationDecision
}

// Pipeline serves requests. Its fields are set once before it serves.
type Pipeline struct {
	Catalogue *route.Catalogue
	Egress    *egress.Egress
	Policy    Policy
	Weights   route.Weights
	// Priors learns quality (feedback, outcomes) and latency; nil: the
	// configured priors only.
	Priors *route.Priors
	// Metrics records requests, tokens, cost and latency; nil: none.
	Metrics *meter.Metrics
	// Strategies is what the operator configured (cascade, mixture, tools).
	Strategies route.Config
	// Tools are the governed tools (tools.go); nil: none.
	Tools ToolRunner
	// ToolsHidden names governed tools never offered to models, e.g. the
	// billing tool usage is sent to.
	ToolsHidden []string
	// Health is the targets' outlier detection: open circuits are excluded
	// from plans and every attempt's outcome feeds it; nil: none.
	Health *health.Tracker
	// FirstEventTimeout bounds the wait for a stream's first content event
	// (0: DefaultFirstEventTimeout).
	FirstEventTimeout time.Duration
	Logger            *zap.Logger
	// Recorders get every request's Outcome (outcome.go).
	Recorders []Recorder
	// Capture decides which client requests' text goes into their Outcome
	// for trace capture (capture.go); nil: none.
	Capture Capture

	// Orchestrator serves the requests it triages as composite
	// (router/orchestrate); nil: every request takes the single-route path.
	Orchestrator Orchestrator
}

func (p *Pipeline) log() *zap.Logger {
	if p.Logger == nil {
		return zap.NewNop()
	}
	return p.Logger
}

// identityInput is id's input.identity, converted once per identity
// (Identity.PolicyValue); where that fails, the map, whose conversion in
// the policy engine reports the same error (a fail-closed denial).
func identityInput(id *identity.Identity) any {
	if v, err := id.PolicyValue(); err == nil {
		return v
	}
	return id.PolicyInput()
}

// Decide asks the policy about a for the caller id (nil: anonymous), with
// the catalogue's targets (converted once, route.Catalogue.PolicyTargets) in the input.
func (p *Pipeline) Decide(ctx context.Context, a *classify.Annotation, id *identity.Identity) policies.Decided {
	return p.Policy.Decide(ctx, policies.Input{Subject: a, Identity: identityInput(id), Targets: p.Catalogue.PolicyTargets()})
}

// derive classifies body, a request derived from rq's (a tool round), and
// asks the policy again with the parent decision in input.derived.
func (p *Pipeline) derive(ctx context.Context, rq *request, kind string, body []byte) (*classify.Annotation, policies.Decided, error) {
	a, err := rq.a.Derive(body)
	if err != nil {
		return nil, policies.Decided{}, err
	}
	parent := rq.dec.Sensitivity()
	if parent == "" {
		parent = rq.a.Sensitivity().String()
	}
	findings := map[string]any{}
	for t, n := range rq.a.Findings() {
		findings[t] = n
	}
	d := p.Policy.Decide(ctx, policies.Input{Subject: a, Identity: identityInput(rq.id), Targets: p.Catalogue.PolicyTargets(),
		Derived: map[string]any{"kind": kind, "parent": map[string]any{"decision_id": rq.dec.ID(), "sensitivity": parent, "findings": findings}}})
	return a, d, nil
}

// request is one request's state while a strategy runs.
type request struct {
	w     http.ResponseWriter
	r     *http.Request
	ctx   context.Context
	a     *classify.Annotation
	d     policies.Decided
	dec   *policies.Decision
	id    *identity.Identity
	plan  route.Plan
	log   *zap.Logger
	begin time.Time
	tried []failed // attempts that failed, for the error and the log
	// release gives back the plan's reservation; never nil once reserved.
	release func()
	outcome Outcome
	// answered, when set, sees every answer delivered (RunDerived).
	answered func(o *outcome)
	// capture: the request consented to trace capture (capture.go).
	capture bool
	// topUp is what tool rounds held past the plan's reservation (holdRound).
	topUp spentWorst
}

// failed is one attempt that did not answer.
type failed struct {
	target string
	err    string
	kind   failure
	// retryAfter is the upstream's Retry-After in seconds (0: none).
	retryAfter int
}

// Serve answers the request decided by d: the model listing, or the plan's
// strategy over the allowed candidates. The returned error is an
// *openai.Error not yet written, or nil once a response has been written
// (or the client went away).
func (p *Pipeline) Serve(w http.ResponseWriter, r *http.Request, a *classify.Annotation, d policies.Decided) error {
	dec := d.Decision()
	if !d.Binds(a) || dec == nil {
		return &openai.Error{Status: http.StatusInternalServerError, Type: "server_error", Code: "decision_mismatch",
			Message: "The policy decision does not belong to this request."}
	}
	w.Header().Set(HeaderDecisionID, dec.ID())
	openai.RequestID(w, r)
	rq := &request{w: w, r: r, ctx: r.Context(), a: a, d: d, dec: dec, id: identity.From(r.Context()), log: p.log(), begin: time.Now()}
	rq.outcome = newOutcome(a, dec, rq.id, rq.begin)
	rq.capture = p.consents(rq)
	defer traceRoute(rq)()
	if a.Endpoint() == openai.EndpointModels {
		err := p.models(rq)
		p.finish(rq, modelsLabel(err), statusOf(err, http.StatusOK))
		return err
	}
	if p.Orchestrator != nil {
		if composite, err := p.Orchestrator.Triage(r, a); err != nil || composite {
			if err != nil {
				p.Metrics.Unrouted(a, "bad_request")
				p.finish(rq, "bad_request", statusOf(err, http.StatusOK))
				return err
			}
			err := p.Orchestrator.Serve(w, r, a, d)
			p.finish(rq, "orchestrated", statusOf(err, http.StatusOK))
			return err
		}
	}
	err := p.serve(rq)
	p.finish(rq, labelOf(err), statusOf(err, http.StatusOK))
	return err
}

// serve is Serve for a request that is not the model listing.
func (p *Pipeline) serve(rq *request) error {
	a, r, w := rq.a, rq.r, rq.w
	cfg := p.Strategies
	cfg.Tools = cfg.Tools && p.Tools != nil && len(p.Tools.Tools()) > 0
	if err := p.plan(rq, r.Header, cfg); err != nil {
		return err
	}
	if err := p.reserve(rq); err != nil {
		return err
	}
	defer rq.release()
	w.Header().Set(HeaderPlan, string(rq.plan.Strategy))
	var err error
	switch rq.plan.Strategy {
	case route.StrategyTools:
		err = p.toolLoop(rq)
	case route.StrategyMixture:
		err = p.mixture(rq)
	case route.StrategyCascade:
		err = p.cascade(rq, rq.plan.Candidates)
	default:
		err = p.single(rq, rq.plan.Candidates)
	}
	var ae *openai.Error
	if errors.As(err, &ae) && everyAttemptFailed(ae) {
		p.Metrics.Unrouted(a, "failed")
	}
	return err
}

// plan makes rq's plan under the strategies cfg, with the selection from
// the operator's weights and the learned priors, the caller's remaining
// budget and the X-Molly-* overrides in h, and logs it. Errors are
// *openai.Error not yet written: 400 for a bad override header, 404 for a
// model no target serves, 503 when no allowed target is left.
func (p *Pipeline) plan(rq *request, h http.Header, cfg route.Config) error {
	a := rq.a
	o, aerr := route.ParseOverrides(h)
	if aerr != nil {
		p.Metrics.Unrouted(a, "bad_request")
		return aerr
	}
	sel := route.Selection{Weights: p.Weights, Priors: p.Priors, Overrides: o}
	if rq.id != nil && rq.id.Budgeted {
		sel.Budgeted, sel.RemainingUSD = true, rq.id.RemainingUSD
	}
	if p.Health != nil {
		sel.Health = p.Health
	}
	planned := time.Now()
	rq.plan = p.Catalogue.NewPlan(a, rq.dec, sel, cfg)
	tracePlan(rq, planned)
	p.logPlan(rq, o)
	if !rq.plan.Known {
		p.Metrics.Unrouted(a, "model_not_found")
		return &openai.Error{Status: http.StatusNotFound, Type: "invalid_request_error", Param: "model", Code: "model_not_found",
			Message: fmt.Sprintf("The model `%s` does not exist or you do not have access to it.", a.Model())}
	}
	if len(rq.plan.Candidates) == 0 {
		p.Metrics.Unrouted(a, "no_target")
		rq.w.Header().Set(HeaderRoute, route.ExcludedHeader(rq.plan.Excluded))
		e := noTarget("No allowed target is available for model `"+a.Model()+"`", rq.plan.Excluded, nil)
		if e.Status == http.StatusForbidden && len(rq.dec.Reasons()) > 0 {
			e.Message += " The policy decided: " + strings.Join(rq.dec.Reasons(), "; ") + "."
		}
		return e
	}
	return nil
}

// newOutcome starts the outcome of a request.
func newOutcome(a *classify.Annotation, dec *policies.Decision, id *identity.Identity, start time.Time) Outcome {
	return Outcome{DecisionID: dec.ID(), Revision: dec.Revision(), Member: id.Name(), Endpoint: string(a.Endpoint()), Model: a.Model(),
		Task: a.Task(), Difficulty: a.Difficulty(), Sensitivity: dec.Sensitivity(), Tiers: dec.Tiers(), Stream: a.Stream(),
		Answered: -1, Start: start, Findings: a.Findings(), Reasons: dec.Reasons(), Code: dec.Code()}
}

// labelOf is the outcome label of a request that ended with err ("" when
// an answer was written: the answer set it).
func labelOf(err error) string {
	var ae *openai.Error
	if !errors.As(err, &ae) {
		if err != nil {
			return "failed"
		}
		return ""
	}
	switch {
	case everyAttemptFailed(ae):
		return "failed"
	case unroutableCodes[ae.Code]:
		return "no_target"
	}
	switch ae.Code {
	case "model_not_found":
		return "model_not_found"
	case "insufficient_quota", "rate_limit_exceeded":
		return "refused"
	}
	if ae.Status == http.StatusForbidden {
		return "denied"
	}
	return "bad_request"
}

// statusOf is the HTTP status err is answered with (ok when nil).
func statusOf(err error, ok int) int {
	var ae *openai.Error
	switch {
	case err == nil:
		return 0 // set by the answer
	case errors.As(err, &ae):
		return ae.Status
	}
	return http.StatusInternalServerError
}

// modelsLabel is the outcome of a models request that ended with err:
// routed when it was answered, else as labelOf says (model_not_found for
// GET /v1/models/{model} of a model not listed).
func modelsLabel(err error) string {
	if err == nil {
		return "routed"
	}
	return labelOf(err)
}

// Denied records the outcome of a request the policy denied (the policy
// step answers it with PolicyError) and returns that error.
func (p *Pipeline) Denied(a *classify.Annotation, d policies.Decided, id *identity.Identity) *openai.Error {
	dec := d.Decision()
	rq := &request{a: a, dec: dec, begin: time.Now()}
	rq.outcome = newOutcome(a, dec, id, rq.begin)
	e := PolicyError(dec)
	p.finish(rq, "denied", e.Status)
	return e
}

// logPlan writes the "route decision" line: every candidate with its score
// terms and every excluded target with the constraint that removed it.
func (p *Pipeline) logPlan(rq *request, o route.Overrides) {
	fields := []zap.Field{zap.String("decision_id", rq.dec.ID()), zap.String("model", rq.a.Model()), zap.String("task", rq.a.Task()),
		zap.Float64("difficulty", rq.a.Difficulty()), zap.String("strategy", string(rq.plan.Strategy)),
		zap.Array("candidates", candidateList(rq.plan.Candidates)), zap.Array("excluded", exclusionList(rq.plan.Excluded)),
		zap.Strings("reasons", rq.plan.Reasons),
		zap.Int("reserve_tokens", rq.plan.Reserve.Tokens), zap.Float64("reserve_usd", rq.plan.Reserve.CostUSD)}
	if o.Prefer != route.PreferNone {
		fields = append(fields, zap.String("prefer", string(o.Prefer)))
	}
	if o.HasMaxCost {
		fields = append(fields, zap.Float64("max_cost_usd", o.MaxCostUSD))
	}
	rq.log.Info("route decision", fields...)
}

// candidateList logs candidates as route.Describe strings, formatted when
// the line is encoded (off the request path, internal/asynclog). The plan's
// slices are never changed in place once planned: derived requests replace
// them or append past what was logged.
type candidateList []route.Candidate

func (l candidateList) MarshalLogArray(enc zapcore.ArrayEncoder) error {
	var buf [160]byte
	for _, c := range l {
		enc.AppendByteString(route.AppendDescribe(buf[:0], c))
	}
	return nil
}

// exclusionList logs exclusions as "<target>: <reason>", like candidateList.
type exclusionList []route.Exclusion

func (l exclusionList) MarshalLogArray(enc zapcore.ArrayEncoder) error {
	for _, e := range l {
		enc.AppendString(e.String())
	}
	return nil
}

// reserve holds the plan's worst case on the caller's ledger when it is a
// meter.Reserver, before any upstream call.
func (p *Pipeline) reserve(rq *request) error {
	rq.release = nil
	err := p.holdWorstCase(rq)
	if rq.release == nil {
		rq.release = func() {}
	}
	return err
}

// reserveAgain holds the plan's worst case once more, for one more
// attempt after a billed failed one (see single), so that attempts
// together never spend past what the ledger admitted; its refusal
// (over budget, rate limited) ends the request.
func (p *Pipeline) reserveAgain(rq *request) error { return p.holdWorstCase(rq) }

// holdWorstCase reserves the plan's worst case on the caller's ledger
// (when it is a meter.Reserver) and adds its release to rq.release.
func (p *Pipeline) holdWorstCase(rq *request) error {
	return p.holdOnLedger(rq, rq.plan.Reserve.Tokens, rq.plan.Reserve.CostUSD)
}

// holdOnLedger reserves tokens and usd on the caller's ledger (when it is a
// meter.Reserver) and adds the release to rq.release.
func (p *Pipeline) holdOnLedger(rq *request, tokens int, usd float64) error {
	if rq.id == nil {
		return nil
	}
	rv, ok := rq.id.Ledger.(meter.Reserver)
	if !ok {
		return nil
	}
	release, err := rv.Reserve(rq.ctx, tokens, usd)
	if err != nil {
		return err
	}
	if prev := rq.release; prev != nil {
		rq.release = func() { release(); prev() }
	} else {
		rq.release = release
	}
	return nil
}

// spentWorst adds up the worst case of the tool rounds sent so far.
type spentWorst struct {
	tokens int
	usd    float64
}

// holdRound adds the worst case of the tool round a, about to be sent to c
// — its prompt at its bound (the conversation as it now is: the offered
// tools' definitions, every earlier answer and tool result, several per
// round when the model calls tools in parallel) and its full completion
// at c's prices — to rounds, and, where the rounds together would pass
// what the plan reserved for them (route's tool reservation assumes one
// result per round and no tool definitions), holds the difference on the
// caller's ledger first (holdWorstCase's rule). Its refusal (the 429)
// ends the conversation; without a ledger that reserves, nothing is held.
func (p *Pipeline) holdRound(rq *request, rounds *spentWorst, a *classify.Annotation, c route.Candidate) error {
	prompt, out := a.PromptBound(), route.CompletionTokens(a)
	rounds.tokens += prompt + out
	rounds.usd += c.Target.Cost(prompt, out)
	tokens, usd := rounds.tokens-rq.plan.Reserve.Tokens-rq.topUp.tokens, rounds.usd-rq.plan.Reserve.CostUSD-rq.topUp.usd
	if tokens <= 0 && usd <= 1e-12 {
		return nil
	}
	tokens, usd = max(tokens, 0), max(usd, 0)
	if err := p.holdOnLedger(rq, tokens, usd); err != nil {
		return err
	}
	rq.topUp.tokens += tokens
	rq.topUp.usd += usd
	return nil
}

type decidedKey struct{}

// WithDecided returns ctx carrying d, from the policy step to the route step.
func WithDecided(ctx context.Context, d policies.Decided) context.Context {
	return context.WithValue(ctx, decidedKey{}, d)
}

// DecidedFrom returns the decision set by the policy step (ok false when none).
func DecidedFrom(ctx context.Context) (policies.Decided, bool) {
	d, ok := ctx.Value(decidedKey{}).(policies.Decided)
	return d, ok
}
