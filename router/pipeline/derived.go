package pipeline

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/tidwall/gjson"
	"go.uber.org/zap"

	"github.com/molly-gateway/molly/policies"
	"github.com/molly-gateway/molly/router/capability"
	"github.com/molly-gateway/molly/router/classify"
	"github.com/molly-gateway/molly/router/identity"
	"github.com/molly-gateway/molly/router/meter"
	"github.com/molly-gateway/molly/router/openai"
	"github.com/molly-gateway/molly/router/route"
)

// Orchestrator serves composite requests (router/orchestrate implements
// it). Serve asks Triage about every routed chat request before planning
// it, so Triage must be cheap.
type Orchestrator interface {
	// Triage reports whether the request is composite: asked for
	// explicitly or recognised. An error is an unwritten *openai.Error
	// (a bad X-Molly-Mode header, a request orchestration cannot serve).
	Triage(r *http.Request, a *classify.Annotation) (bool, error)
	// Serve answers a composite request, with Pipeline.Serve's contract.
	Serve(w http.ResponseWriter, r *http.Request, a *classify.Annotation, d policies.Decided) error
}

// Parent is the client request derived requests come from.
type Parent struct {
	Annotation *classify.Annotation
	Decided    policies.Decided // the decision on Annotation
	Identity   *identity.Identity
	// Header is the client's request header: X-Molly-Prefer and
	// X-Molly-Max-Cost steer every derived request's selection, and the
	// headers egress forwards go upstream with it.
	Header http.Header
}

// Derived is one chat request derived from a Parent: an orchestration
// subtask, a controller's planning call.
type Derived struct {
	// Kind is input.derived.kind for the policy, e.g. "subtask".
	Kind string
	// Body is a non-streamed chat completion request.
	Body []byte
	// MaxTier is the highest tier ("T0".."T3") a candidate may be on; ""
	// leaves the tiers as the derived request's own decision allows.
	MaxTier string
	// MaxCostUSD, above 0, excludes candidates expected to cost more (on
	// top of the client's X-Molly-Max-Cost).
	MaxCostUSD float64
	// First starts with the candidate ranked First (modulo their number),
	// the others after it in ranking order as fallbacks, so alternatives
	// of one subtask start on different targets.
	First int
	// Tools offers the governed tools the policy allows to the answering
	// model (the tool-loop strategy).
	Tools bool
	// Label names the request in the logs (a subtask id).
	Label string
}

// Answer is what a derived request obtained. On an error the fields known
// by then (decision, fallbacks) are set.
type Answer struct {
	Status       int
	Body         []byte // the answer as delivered: placeholders restored
	Content      string // choices[0].message.content
	FinishReason string // choices[0].finish_reason
	Target, Tier string
	Model        string // the upstream model that answered
	// DecisionID, Sensitivity and Tiers are the derived request's own
	// decision: the tiers its data allows.
	DecisionID  string
	Sensitivity string
	Tiers       []string
	// Score and Quality are the answering candidate's selection score and
	// quality prior, BestScore the best ranked candidate's (for FusedScore).
	Score, BestScore, Quality float64
	// Logprob is the mean token log-probability over LogprobTokens tokens
	// (0 tokens: the answer carried none).
	Logprob       float64
	LogprobTokens int
	// PromptTokens, CompletionTokens and CostUSD (USD) add up every usage
	// record the derived request wrote to the caller's ledger: each tool
	// round, fallbacks that were billed.
	PromptTokens, CompletionTokens int
	CostUSD                        float64
	Latency                        time.Duration
	Strategy                       string
	Candidates                     []string // "<target>/<model>", in the order tried
	Excluded                       []string // "<target>: <why>"
	Fallbacks                      []string // attempts that failed, "<target>: <error>"
}

// RunDerived runs one request derived from parent the way every request
// runs, without writing to the client: it is classified on its own body
// (Annotation.Derive) and decided by the policy with input.derived {kind,
// parent}, planned by the catalogue (single with fallback, or the tool loop
// with d.Tools), narrowed to d.MaxTier and d.MaxCostUSD, and sent by the
// strategy's attempts through egress. The caller reserved the worst case of
// all it derives; only what the strategy needs past its own plan (a tool
// round over it, a fallback after a billed attempt) is held, on the
// caller's ledger, until RunDerived returns. The usage of every answer is
// recorded in the caller's ledger as for any request. Errors: a 403
// *openai.Error for a derived request the policy denies, 404 for a model no
// target serves, 503 when no candidate is left or every one failed, the
// classifier's 400, ctx's error when ctx ended.
func (p *Pipeline) RunDerived(ctx context.Context, parent Parent, d Derived) (Answer, error) {
	pdec := parent.Decided.Decision()
	if !parent.Decided.Binds(parent.Annotation) || pdec == nil {
		return Answer{}, &openai.Error{Status: http.StatusInternalServerError, Type: "server_error", Code: "decision_mismatch",
			Message: "The policy decision does not belong to this request."}
	}
	counted := &countingLedger{}
	if parent.Identity != nil {
		counted.inner = parent.Identity.Ledger
	}
	id := parent.Identity.WithLedger(counted)
	a, dd, err := p.derive(ctx, &request{a: parent.Annotation, dec: pdec, id: parent.Identity}, d.Kind, d.Body)
	if err != nil {
		return Answer{}, err
	}
	dec := dd.Decision()
	ans := Answer{DecisionID: dec.ID(), Sensitivity: dec.Sensitivity(), Tiers: dec.Tiers()}
	if !dec.Allowed() {
		return ans, PolicyError(dec)
	}
	if a.Stream() || a.Endpoint() != openai.EndpointChat {
		return ans, openai.InvalidRequest("stream", "A derived request must be a non-streamed chat completion.")
	}
	o, aerr := route.ParseOverrides(parent.Header)
	if aerr != nil {
		return ans, aerr
	}
	sel := route.Selection{Weights: p.Weights, Priors: p.Priors, Overrides: o}
	if d.MaxCostUSD > 0 && (!sel.HasMaxCost || d.MaxCostUSD < sel.MaxCostUSD) {
		sel.MaxCostUSD, sel.HasMaxCost = d.MaxCostUSD, true
	}
	if id.Budgeted {
		sel.Budgeted, sel.RemainingUSD = true, id.RemainingUSD
	}
	cfg := route.Config{Tools: d.Tools && p.Tools != nil && len(p.Tools.Tools()) > 0,
		ToolSteps: p.Strategies.ToolSteps, ToolResultTokens: p.Strategies.ToolResultTokens}
	capt := &capture{header: http.Header{}}
	log := p.log().With(zap.String("derived", d.Kind), zap.String("label", d.Label), zap.String("parent_decision_id", pdec.ID()))
	rq := &request{w: capt, r: &http.Request{Header: parent.Header}, ctx: ctx, a: a, d: dd, dec: dec, id: id, log: log,
		begin: time.Now(), release: func() {}}
	rq.plan = p.Catalogue.NewPlan(a, dec, sel, cfg)
	if ceiling := slices.Index(policies.Tiers, d.MaxTier); ceiling >= 0 {
		kept := rq.plan.Candidates[:0:0]
		for _, c := range rq.plan.Candidates {
			if slices.Index(policies.Tiers, c.Target.Tier) > ceiling {
				if !slices.ContainsFunc(rq.plan.Excluded, func(e route.Exclusion) bool { return e.Target == c.Target.Name }) {
					rq.plan.Excluded = append(rq.plan.Excluded, route.Exclusion{Target: c.Target.Name,
						Reason: fmt.Sprintf("tier %s above the ceiling %s", c.Target.Tier, d.MaxTier)})
				}
				continue
			}
			kept = append(kept, c)
		}
		rq.plan.Candidates = kept
	}
	if n := len(rq.plan.Candidates); n > 1 && d.First%n != 0 {
		i := d.First % n
		rq.plan.Candidates = append(slices.Clone(rq.plan.Candidates[i:]), rq.plan.Candidates[:i]...)
	}
	p.logPlan(rq, o)
	ans.Strategy = string(rq.plan.Strategy)
	for _, c := range rq.plan.Candidates {
		ans.Candidates = append(ans.Candidates, c.Label())
	}
	for _, e := range rq.plan.Excluded {
		ans.Excluded = append(ans.Excluded, e.String())
	}
	if !rq.plan.Known {
		return ans, &openai.Error{Status: http.StatusNotFound, Type: "invalid_request_error", Param: "model", Code: "model_not_found",
			Message: fmt.Sprintf("The model `%s` does not exist or you do not have access to it.", a.Model())}
	}
	if len(rq.plan.Candidates) == 0 {
		return ans, noTarget("No allowed target is available for model `"+a.Model()+"`", rq.plan.Excluded, nil)
	}
	var got *outcome
	rq.answered = func(o *outcome) { got = o }
	defer func() { rq.release() }() // what the strategy held past the caller's reservation
	if rq.plan.Strategy == route.StrategyTools {
		err = p.toolLoop(rq)
	} else {
		err = p.single(rq, rq.plan.Candidates)
	}
	ans.Latency = time.Since(rq.begin)
	for _, f := range rq.tried {
		ans.Fallbacks = append(ans.Fallbacks, f.target+": "+f.err)
	}
	ans.PromptTokens, ans.CompletionTokens, ans.CostUSD = counted.totals()
	switch {
	case ctx.Err() != nil:
		return ans, ctx.Err()
	case err != nil:
		return ans, err
	case got == nil:
		return ans, &openai.Error{Status: http.StatusBadGateway, Type: "upstream_error", Code: "no_answer", Message: "The derived request obtained no answer."}
	}
	ans.Status, ans.Body = capt.status, capt.body.Bytes()
	ans.Content = gjson.GetBytes(ans.Body, "choices.0.message.content").String()
	ans.FinishReason = gjson.GetBytes(ans.Body, "choices.0.finish_reason").String()
	ans.Target, ans.Tier, ans.Model = got.cand.Target.Name, got.cand.Target.Tier, got.cand.Model
	ans.Score, ans.Quality = got.cand.Score, got.cand.Quality
	ans.BestScore = rq.plan.Candidates[0].Score
	for _, c := range rq.plan.Candidates {
		ans.BestScore = max(ans.BestScore, c.Score)
	}
	ans.Logprob, ans.LogprobTokens = MeanLogprob(ans.Body)
	if got.tokens > 0 && ans.LogprobTokens == 0 {
		ans.Logprob, ans.LogprobTokens = got.logprob, got.tokens
	}
	return ans, nil
}

// OfferedTools lists the governed tools the policy lets the gateway offer
// to a model on tier for id (tool_offer), sorted by name; hidden tools
// (ToolsHidden) never.
func (p *Pipeline) OfferedTools(ctx context.Context, id *identity.Identity, tier string) []ToolSpec {
	m := p.offered(ctx, id, tier)
	out := make([]ToolSpec, 0, len(m))
	for _, s := range m {
		out = append(out, s)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// RunTool decides and runs the governed tool name for a request derived
// from parent, as if a model on tier had called it (the planner's tier):
// the tool must be offered to tier (tool_offer), the call is decided by the
// tool policy with the caller's scopes (tool_decision), written to the
// audit log (tool_call_id callID, target target), and its result bounded
// like a tool round's (Config.ResultTokens). The idempotency key is
// "<parent decision id>:<callID>". It returns the result JSON or a
// *ToolError: "not_found" for a tool that is not offered, the policy's
// "permission_denied", "result_too_large", or the tool's own code.
func (p *Pipeline) RunTool(ctx context.Context, parent Parent, tier, target, callID, name string, args []byte) ([]byte, *ToolError) {
	spec, ok := p.offered(ctx, parent.Identity, tier)[name]
	if !ok {
		return nil, &ToolError{Code: "not_found", Message: fmt.Sprintf("no tool %q is offered to %s", name, tier)}
	}
	decisionID := parent.Decided.Decision().ID()
	res, _, te := p.callTool(ctx, p.log(), decisionID, callID, target, tier, parent.Identity, spec, string(args),
		decisionID+":"+callID, parent.Annotation.Classifier())
	if te == nil && capability.BoundTokens(string(res)) > p.Strategies.ResultTokens() { // at its bound, as the plan reserved it
		te = &ToolError{Code: "result_too_large", Message: fmt.Sprintf("the tool result is over %d tokens", p.Strategies.ResultTokens())}
	}
	if te != nil {
		return nil, te
	}
	return res, nil
}

// ToolResultJSON is the content a failed tool call gives the model and the
// plan: {"error": {"code", "message"}}.
func ToolResultJSON(te *ToolError) []byte {
	b, _ := json.Marshal(map[string]any{"error": te})
	return b
}

// capture is the ResponseWriter of a derived request: the strategies
// write the answer here instead of to the client.
type capture struct {
	header http.Header
	status int
	body   bytes.Buffer
}

func (c *capture) Header() http.Header { return c.header }

func (c *capture) WriteHeader(status int) {
	if c.status == 0 {
		c.status = status
	}
}

func (c *capture) Write(b []byte) (int, error) {
	if c.status == 0 {
		c.status = http.StatusOK
	}
	return c.body.Write(b)
}

// countingLedger adds up what one derived request records, passing every
// record on to the caller's ledger (none: nil).
type countingLedger struct {
	inner meter.Ledger
	mu    sync.Mutex
	p, c  int
	usd   float64
}

func (l *countingLedger) Record(ctx context.Context, u meter.Usage) error {
	l.mu.Lock()
	l.p, l.c, l.usd = l.p+u.PromptTokens, l.c+u.CompletionTokens, l.usd+u.CostUSD
	l.mu.Unlock()
	if l.inner == nil {
		return nil
	}
	return l.inner.Record(ctx, u)
}

// Reserve passes a reservation on to the caller's ledger when it makes
// them (what a derived tool conversation holds past its caller's
// reservation, holdRound); nothing is held otherwise.
func (l *countingLedger) Reserve(ctx context.Context, tokens int, expectedUSD float64) (func(), error) {
	if rv, ok := l.inner.(meter.Reserver); ok {
		return rv.Reserve(ctx, tokens, expectedUSD)
	}
	return func() {}, nil
}

func (l *countingLedger) totals() (prompt, completion int, usd float64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.p, l.c, l.usd
}
