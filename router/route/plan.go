package route

import (
	"encoding/json"
	"fmt"
	"math"

	"github.com/molly-gateway/molly/policies"
	"github.com/molly-gateway/molly/router/classify"
	"github.com/molly-gateway/molly/router/openai"
)

// Strategy names how a Plan's candidates are tried.
type Strategy string

// Strategies.
const (
	// StrategySingle sends the request to the first candidate and, on an
	// upstream failure before anything reached the client, to the next
	// (fallback), in order.
	StrategySingle Strategy = "single"
	// StrategyCascade tries candidates cheapest first and escalates while
	// the escalation policy asks for it (Cascade).
	StrategyCascade Strategy = "cascade"
	// StrategyMixture asks the first Members candidates in parallel and
	// returns the best answer; the rest are the fallback (Mixture).
	StrategyMixture Strategy = "mixture"
	// StrategyTools offers the gateway's governed tools to the model and
	// runs the calls it makes, each round decided by the policy again.
	StrategyTools Strategy = "tools"
	// StrategyModels answers the model listing from the catalogue.
	StrategyModels Strategy = "models"
)

// DefaultToolSteps is how many rounds of tool calls one request may make
// when Config.ToolSteps is 0.
const DefaultToolSteps = 4

// DefaultToolResultTokens bounds the tokens one tool result may add to the
// conversation, counted at their bound (capability.BoundTokens: its bytes;
// results longer are refused to the model as too large), so the worst case
// of a tool conversation is known before it starts.
const DefaultToolResultTokens = 2048

// SelfCheckTokens is the completion budget of one self-check follow-up.
const SelfCheckTokens = 8

// Config is what the operator configured for strategies.
type Config struct {
	Cascade *Cascade
	Mixture *Mixture
	// Tools reports governed tools configured for the gateway to offer.
	Tools bool
	// ToolSteps bounds the rounds of tool calls (0: DefaultToolSteps);
	// ToolResultTokens the tokens of one result (0: DefaultToolResultTokens).
	ToolSteps, ToolResultTokens int
}

// Steps is the tool-round bound.
func (c Config) Steps() int {
	if c.ToolSteps > 0 {
		return c.ToolSteps
	}
	return DefaultToolSteps
}

// ResultTokens is the tool-result bound.
func (c Config) ResultTokens() int {
	if c.ToolResultTokens > 0 {
		return c.ToolResultTokens
	}
	return DefaultToolResultTokens
}

// Reservation is the worst case of a plan, held against the caller's
// budget and token rate before the first upstream call: every answer the
// strategy may obtain, each at its full completion budget and its prompt at
// its bound (classify.Annotation.PromptBound: what no tokenizer exceeds),
// at the prices of the costliest candidates it may reach.
type Reservation struct {
	Tokens  int     `json:"tokens"`
	CostUSD float64 `json:"cost_usd"`
}

// Plan is where and how one request is served: a pure function of the
// annotation, the decision and the selection (NewPlan), executed by the
// strategies in package pipeline.
type Plan struct {
	Strategy Strategy `json:"strategy"`
	// Candidates in the order they are tried: for a cascade its order, for
	// a mixture the members first.
	Candidates []Candidate `json:"candidates"`
	// Members is how many of the first candidates a mixture asks at once.
	Members int `json:"members,omitempty"`
	// Excluded says why each other target serving the model is not a candidate.
	Excluded []Exclusion `json:"excluded,omitempty"`
	// Known is false when no target serves the model at all (404).
	Known bool `json:"known"`
	// Adapter is the first candidate's T0 adapter, "" for none.
	Adapter string      `json:"adapter,omitempty"`
	Reserve Reservation `json:"reserve"`
	Reasons []string    `json:"reasons"`
}

// NewPlan decides how the request a (decided by d) is served. It reads
// learned priors through sel.Priors and otherwise depends only on its
// arguments.
func (c *Catalogue) NewPlan(a *classify.Annotation, d *policies.Decision, sel Selection, cfg Config) Plan {
	if a.Endpoint() == openai.EndpointModels {
		return Plan{Strategy: StrategyModels, Known: true, Reasons: []string{"the model listing is answered from the catalogue"}}
	}
	cands, excluded, known := c.RankWith(a, d, sel)
	if cands == nil {
		cands = []Candidate{}
	}
	p := Plan{Strategy: StrategySingle, Candidates: cands, Excluded: excluded, Known: known}
	if len(cands) > 0 {
		p.Adapter = cands[0].Adapter()
	}
	chat := a.Endpoint() == openai.EndpointChat
	switch {
	case len(cands) == 0:
		p.Reasons = append(p.Reasons, "no allowed candidate")
	case cfg.Tools && chat && !a.Stream() && !a.Tools():
		p.Strategy = StrategyTools
		p.Reasons = append(p.Reasons, fmt.Sprintf("governed tools may be offered (at most %d rounds)", cfg.Steps()))
	default:
		if cfg.Mixture != nil && chat && !a.Stream() && len(cands) > 1 && a.TaskEntropy() > cfg.Mixture.Entropy {
			budget := math.Inf(1)
			if sel.Budgeted {
				budget = sel.RemainingUSD
			}
			if m, ok := d.MaxCostUSD(); ok {
				budget = min(budget, m)
			}
			if sel.HasMaxCost {
				budget = min(budget, sel.MaxCostUSD)
			}
			if members, rest := cfg.Mixture.members(cands, budget); len(members) > 1 {
				p.Strategy, p.Members = StrategyMixture, len(members)
				p.Candidates = append(members, rest...)
				p.Reasons = append(p.Reasons, fmt.Sprintf("task entropy %.2f nats over %.2f: %d members in parallel", a.TaskEntropy(), cfg.Mixture.Entropy, len(members)))
				break
			}
			p.Reasons = append(p.Reasons, "mixture members do not fit the budget")
		}
		if cfg.Cascade != nil && chat && (!a.Stream() || cfg.Cascade.HoldTokens > 0) && len(cands) > 1 {
			p.Strategy = StrategyCascade
			p.Candidates = cfg.Cascade.order(cands)
			p.Reasons = append(p.Reasons, fmt.Sprintf("cascade of up to %d answers, order %s", cfg.Cascade.Attempts(), orderName(cfg.Cascade)))
		}
	}
	if p.Strategy == StrategySingle && len(cands) > 1 {
		p.Reasons = append(p.Reasons, fmt.Sprintf("%d fallbacks in order", len(cands)-1))
	}
	p.Reserve = reservation(a, p, cfg)
	return p
}

func orderName(c *Cascade) string {
	if c.Order == "" {
		return OrderCheap
	}
	return c.Order
}

// reservation is the plan's worst case (see Reservation).
func reservation(a *classify.Annotation, p Plan, cfg Config) Reservation {
	if len(p.Candidates) == 0 {
		return Reservation{}
	}
	// The prompt at its bound, not its estimate: a tokenizer may count
	// several times the estimate (CJK, emoji, code), never more than the bound.
	prompt, out := a.PromptBound(), CompletionTokens(a)
	cost := func(c Candidate, prompt, out int) float64 { return c.Target.Cost(prompt, out) }
	// costliest answers first: the worst case spends on the priciest targets
	worst := func(n, prompt, out int, from []Candidate) (int, float64) {
		costs := make([]float64, len(from))
		for i, c := range from {
			costs[i] = cost(c, prompt, out)
		}
		sortDesc(costs)
		tokens, usd := 0, 0.0
		for i := 0; i < n && i < len(costs); i++ {
			tokens += prompt + out
			usd += costs[i]
		}
		return tokens, usd
	}
	switch p.Strategy {
	case StrategyCascade:
		n := cfg.Cascade.Attempts()
		t, c := worst(n, prompt, out, p.Candidates)
		if cfg.Cascade.SelfCheck {
			// a follow-up per answer: the conversation, the answer, the question
			st, sc := worst(n, prompt+out+32, SelfCheckTokens, p.Candidates)
			t, c = t+st, c+sc
		}
		return Reservation{t, c}
	case StrategyMixture:
		t, c := worst(p.Members, prompt, out, p.Candidates[:p.Members])
		// every member may fail (unbilled) and the rest answer one by one
		if rt, rc := worst(1, prompt, out, p.Candidates[p.Members:]); rc > c {
			t, c = rt, rc
		}
		return Reservation{t, c}
	case StrategyTools:
		// round i's prompt holds the earlier rounds' answers and results
		tokens, usd := 0, 0.0
		for i := 0; i <= cfg.Steps(); i++ {
			pi := prompt + i*(out+cfg.ResultTokens())
			t, c := worst(1, pi, out, p.Candidates)
			tokens, usd = tokens+t, usd+c
		}
		return Reservation{tokens, usd}
	}
	t, c := worst(1, prompt, out, p.Candidates)
	return Reservation{t, c}
}

func sortDesc(x []float64) {
	for i := 1; i < len(x); i++ {
		for j := i; j > 0 && x[j] > x[j-1]; j-- {
			x[j], x[j-1] = x[j-1], x[j]
		}
	}
}

// MarshalJSON writes a candidate for plans and logs: its target by name
// and tier, the model, the score terms.
func (c Candidate) MarshalJSON() ([]byte, error) {
	return json.Marshal(struct {
		Target   string  `json:"target"`
		Tier     string  `json:"tier"`
		Model    string  `json:"model"`
		Quality  float64 `json:"quality"`
		CostUSD  float64 `json:"cost_usd"`
		LatencyS float64 `json:"latency_s"`
		Score    float64 `json:"score"`
		Learned  int64   `json:"learned,omitempty"`
	}{c.Target.Name, c.Target.Tier, c.Model, round6(c.Quality), round6(c.CostUSD), round6(c.LatencyS), round6(c.Score), c.Learned})
}

func round6(x float64) float64 { return math.Round(x*1e6) / 1e6 }
