package route

import (
	"net/http"
	"slices"
	"strconv"
	"strings"

	"github.com/molly-gateway/molly/router/capability"
	"github.com/molly-gateway/molly/router/openai"
)

// Request headers that steer one request's selection.
const (
	// HeaderMaxCost caps the expected cost of the request in USD, e.g.
	// "0.002": costlier candidates are excluded (on top of the policy's max_cost_usd).
	HeaderMaxCost = "X-Molly-Max-Cost"
	// HeaderPrefer re-weights the objective: "local", "cheap" or "best" (see Prefer).
	HeaderPrefer = "X-Molly-Prefer"
	// HeaderRoute explains the decision on the response (see RouteHeader).
	HeaderRoute = "X-Molly-Route"
)

// Prefer is a per-request re-weighting of the selection objective.
type Prefer string

// The X-Molly-Prefer values.
const (
	// PreferNone keeps the configured weights.
	PreferNone Prefer = ""
	// PreferLocal subtracts LocalPenalty per tier step away from T0
	// (T1 −0.1, T2 −0.2, T3 −0.3): a remote target must be that much better.
	PreferLocal Prefer = "local"
	// PreferCheap multiplies the cost weight by CheapFactor, and makes it at
	// least CheapMinWeight per USD, so price dominates.
	PreferCheap Prefer = "cheap"
	// PreferBest sets both weights to zero: quality alone, ties to the more local tier.
	PreferBest Prefer = "best"
)

// Re-weighting constants of Prefer.
const (
	LocalPenalty   = 0.1 // quality points per tier step, PreferLocal
	CheapFactor    = 10  // cost weight multiplier, PreferCheap
	CheapMinWeight = 100 // per USD: a cent costs at least one quality point, PreferCheap
)

func (p Prefer) weights(w Weights) Weights {
	switch p {
	case PreferBest:
		return Weights{}
	case PreferCheap:
		w.Cost = max(w.Cost*CheapFactor, CheapMinWeight)
	}
	return w
}

// Overrides are a request's own constraints and preferences, from its headers.
type Overrides struct {
	MaxCostUSD float64 // X-Molly-Max-Cost, when HasMaxCost
	HasMaxCost bool
	Prefer     Prefer // X-Molly-Prefer
}

// Selection is everything RankWith weighs besides the request and the decision.
type Selection struct {
	Weights Weights
	// Priors supplies learned quality and latency; nil: the configured priors only.
	Priors *Priors
	Overrides
	// Budgeted and RemainingUSD are the caller's budget (Identity): when
	// set, candidates whose worst case (the prompt at its bound and the
	// full completion budget at the target's prices, what the reservation
	// holds for an answer from it) exceeds RemainingUSD are excluded, but
	// only if at least one candidate fits. When none fits every candidate
	// stays: the budget is enforced by the ledger's reservation (Reserver),
	// which answers 429 insufficient_quota when the plan's worst case does
	// not fit what is neither spent nor held by requests in flight.
	Budgeted     bool
	RemainingUSD float64
	// Health, when set, removes targets whose circuit is open (outlier
	// detection, router/health): each is excluded with the reason.
	Health Health
}

// Health says whether a target may be planned now (*health.Tracker):
// ok false removes it from the plan, with reason ("circuit open (…)").
type Health interface {
	Admit(target string) (ok bool, reason string)
}

// ParseOverrides reads X-Molly-Max-Cost (a non-negative number of USD) and
// X-Molly-Prefer (local, cheap or best; case-insensitive), and checks
// X-Molly-Trace (on or off, case-insensitive; read by the trace capture).
// Errors are 400 invalid_request_error naming the header.
func ParseOverrides(h http.Header) (Overrides, *openai.Error) {
	var o Overrides
	if v := strings.TrimSpace(h.Get("X-Molly-Trace")); v != "" && !strings.EqualFold(v, "on") && !strings.EqualFold(v, "off") {
		return o, openai.InvalidRequest("X-Molly-Trace", "Invalid X-Molly-Trace header %q: expected on or off.", v)
	}
	if v := strings.TrimSpace(h.Get(HeaderMaxCost)); v != "" {
		f, err := strconv.ParseFloat(v, 64)
		if err != nil || f < 0 || f != f || f > 1e9 {
			return o, openai.InvalidRequest(HeaderMaxCost, "Invalid %s header %q: expected a non-negative number of USD such as 0.01.", HeaderMaxCost, v)
		}
		o.MaxCostUSD, o.HasMaxCost = f, true
	}
	if v := strings.TrimSpace(h.Get(HeaderPrefer)); v != "" {
		p := Prefer(strings.ToLower(v))
		if !slices.Contains([]Prefer{PreferLocal, PreferCheap, PreferBest}, p) {
			return o, openai.InvalidRequest(HeaderPrefer, "Invalid %s header %q: expected local, cheap or best.", HeaderPrefer, v)
		}
		o.Prefer = p
	}
	return o, nil
}

// adapterVariant: for an engine target asked for a base model up (no
// ":"), when the engine serves the adapter "<up>:<task>" — the request's
// task is that adapter's domain — it returns that model name. The adapter
// is then a candidate beside the base model, each with its own prior: the
// adapter's seed is the target's `quality <task>`, the base model's its
// `quality default` (an unadapted model gets no credit for the domain).
func (t *Target) adapterVariant(up, task string) (string, bool) {
	if t.engine == nil || task == "" || task == capability.TaskEmbedding || strings.Contains(up, ":") {
		return "", false
	}
	name := up + ":" + task
	if slices.Contains(t.engine.Models(), name) {
		return name, true
	}
	return "", false
}

// seed is the configured quality prior of model on target t for task. On
// an engine target, when task is the domain of an adapter the engine
// serves, `quality <task>` belongs to that adapter: the base model and the
// other adapters get the target's default for it.
func (t *Target) seed(model, task string) float64 {
	if t.engine != nil && task != "" {
		if _, adapter, _ := strings.Cut(model, ":"); adapter != task && slices.ContainsFunc(t.engine.Models(), func(m string) bool {
			return strings.HasSuffix(m, ":"+task)
		}) {
			return t.quality("default")
		}
	}
	return t.quality(task)
}

// Seed is the configured quality prior of model on t for task, before
// anything was learned (see seed): what a promotion's gain starts from.
func (t *Target) Seed(model, task string) float64 { return t.seed(model, task) }

// Adapter returns the adapter part of a T0 model name "<base>:<adapter>"
// on an engine target, or "".
func (c Candidate) Adapter() string {
	if c.Target == nil || c.Target.Kind != KindEngine {
		return ""
	}
	_, a, _ := strings.Cut(c.Model, ":")
	return a
}

// Domains returns the adapter names the engine targets serve now
// ("billing" for "molly-demo:billing"), sorted and de-duplicated: the task
// categories the capability estimator adds to the built-in ones. Safe to
// call on every request; nil on a nil catalogue.
func (c *Catalogue) Domains() []string {
	if c == nil {
		return nil
	}
	var out []string
	for _, t := range c.targets {
		if t.engine == nil {
			continue
		}
		for _, m := range t.engine.Models() {
			if _, a, ok := strings.Cut(m, ":"); ok && a != "" {
				out = append(out, a)
			}
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}
