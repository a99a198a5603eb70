package route

import (
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/molly-gateway/molly/policies"
	"github.com/molly-gateway/molly/router/classify"
	"github.com/molly-gateway/molly/router/openai"
)

// Weights trade quality against cost and latency in the selection objective
//
//	score = quality − Cost·expected_cost_usd − Latency·expected_latency_s
//
// Quality priors are in [0,1]. With the defaults a request expected to cost
// one US cent loses 0.1 quality points, and one second of latency 0.05.
type Weights struct {
	Cost    float64 `json:"cost_weight,omitempty"`    // per USD
	Latency float64 `json:"latency_weight,omitempty"` // per second
}

// DefaultWeights are used where the config sets none.
var DefaultWeights = Weights{Cost: 10, Latency: 0.05}

// DefaultCompletionTokens is the completion length assumed for cost when the
// request sets no max_tokens.
const DefaultCompletionTokens = 256

// Candidate is a target that may serve the request, with its score terms.
type Candidate struct {
	Target   *Target
	Model    string   // the upstream model name
	Quality  float64  // prior for the request's task, in [0,1]
	CostUSD  float64  // expected cost of this request
	LatencyS float64  // expected latency in seconds
	Score    float64  // the objective; higher is better
	Key      PriorKey // the quality prior it was scored with: (target, Model, task)
	Learned  int64    // observations behind Quality; 0: the configured seed
}

// Exclusion says why a target serving the model was not a candidate.
type Exclusion struct {
	Target string `json:"target"`
	Reason string `json:"reason"`
	// Kind is what kind of constraint removed it, which decides the
	// status of a request no target is left for (pipeline); Need is the
	// missing capability of a KindCapability exclusion.
	Kind ExclusionKind `json:"-"`
	Need string        `json:"-"`
}

// ExclusionKind classifies exclusions.
type ExclusionKind string

// Exclusion kinds.
const (
	ExcludedPolicy     ExclusionKind = "policy"     // tier, region or cost limit of the decision
	ExcludedEndpoint   ExclusionKind = "endpoint"   // the target does not serve the endpoint
	ExcludedModality   ExclusionKind = "modality"   // an input modality the target does not accept
	ExcludedCapability ExclusionKind = "capability" // a capability the request needs (Needs)
	ExcludedContext    ExclusionKind = "context"    // the prompt and completion do not fit the context window
	ExcludedCost       ExclusionKind = "cost"       // over the client's X-Molly-Max-Cost
	ExcludedBudget     ExclusionKind = "budget"     // over the caller's remaining budget
	ExcludedHealth     ExclusionKind = "health"     // ejected by outlier detection (router/health): transient
	ExcludedKey        ExclusionKind = "key"        // its api_key_env variable is not set (Target.MissingKey): the gateway's configuration
)

// Needs lists the capabilities request a needs from a target, in
// AllCapabilities order: CapTools for declared tools (unless tool_choice
// is "none") and for tool turns in the conversation, CapJSONSchema for
// response_format json_schema or json_object, CapAudio for "modalities"
// listing "audio" (a spoken answer), CapLogprobs for logprobs.
// Modalities and endpoints are checked on their own (Target.Modalities,
// Target.Endpoints).
func Needs(a *classify.Annotation) []string {
	var out []string
	r := a.Request()
	if (len(r.Tools) > 0 && r.ToolChoice != "none") || r.ToolTurns {
		out = append(out, CapTools)
	}
	if r.ResponseFormat == "json_schema" || r.ResponseFormat == "json_object" {
		out = append(out, CapJSONSchema)
	}
	if r.AudioOut {
		out = append(out, CapAudio)
	}
	if r.Logprobs {
		out = append(out, CapLogprobs)
	}
	return out
}

// needWhy says what in the request needs capability c.
var needWhy = map[string]string{
	CapTools:      "the request uses tools",
	CapJSONSchema: "the request sets response_format",
	CapAudio:      "the request asks for audio output",
	CapLogprobs:   "the request asks for logprobs",
}

func (e Exclusion) String() string { return e.Target + ": " + e.Reason }

// Rank returns the targets that may serve a, best first, and the ones the
// decision or the request's needs excluded, scored with the configured
// priors and no per-request overrides (RankWith with Selection{Weights: w}).
// known is false when no target serves a.Model() at all (a 404 rather than a 503).
func (c *Catalogue) Rank(a *classify.Annotation, d *policies.Decision, w Weights) (cands []Candidate, excluded []Exclusion, known bool) {
	return c.RankWith(a, d, Selection{Weights: w})
}

// RankWith ranks like Rank with learned priors and per-request overrides.
// A target is excluded, with the first reason that applies, for its tier
// or region (the decision), the endpoint, an input modality, a capability
// the request needs, its context window, the policy's or the client's cost
// limit, a missing API key (Target.MissingKey: the request would fit it,
// but it cannot be sent there) and an open circuit (s.Health). The others
// are scored:
//
//	score = quality − λ_cost·expected_cost_usd − λ_latency·expected_latency_s − local_penalty
//
// quality is the learned prior for (target, model, task) when s.Priors has
// one, else the configured seed; latency is the target's learned latency
// (time to first byte for a stream, total otherwise) once observed, else the
// configured prior. s.Prefer re-weights (see Prefer); s.MaxCostUSD excludes
// costlier candidates, and the caller's remaining budget those whose worst
// case exceeds it when at least one candidate fits it (see Selection.Budgeted). For an engine
// target asked for a base model, when the request's task names an adapter
// the engine serves ("<base>:<task>"), that adapter is a candidate of its
// own (see adapterVariant), ranked before the base model on equal scores.
func (c *Catalogue) RankWith(a *classify.Annotation, d *policies.Decision, s Selection) (cands []Candidate, excluded []Exclusion, known bool) {
	maxCost, capped := d.MaxCostUSD()
	w := s.Prefer.weights(s.Weights)
	out := CompletionTokens(a)
	needs := Needs(a)
	for _, t := range c.targets {
		up, ok := t.upstream(a.Model())
		if !ok {
			continue
		}
		known = true
		cost := (float64(a.PromptTokens())*t.PriceIn + float64(out)*t.PriceOut) / 1e6
		var why, need string
		var kind ExclusionKind
		missing := func() string {
			for _, n := range needs {
				if !t.Supports(n) {
					return n
				}
			}
			return ""
		}
		switch {
		case !d.AllowsTier(t.Tier):
			why, kind = fmt.Sprintf("tier %s not allowed by the policy", t.Tier), ExcludedPolicy
		case !RegionAllowed(d, t):
			why, kind = fmt.Sprintf("region %q outside the allowed regions %s", t.Region, strings.Join(d.Regions(), ",")), ExcludedPolicy
		case len(t.Endpoints) > 0 && !slices.Contains(t.Endpoints, string(a.Endpoint())):
			why, kind = fmt.Sprintf("does not serve %s (serves %s)", a.Endpoint(), strings.Join(t.Endpoints, ", ")), ExcludedEndpoint
		case !modalitiesOK(a.Modalities(), t.Modalities):
			why, kind = fmt.Sprintf("accepts %s, request needs %s", strings.Join(t.Modalities, ","), strings.Join(a.Modalities(), ",")), ExcludedModality
		case missing() != "":
			need = missing()
			why, kind = fmt.Sprintf("does not support %s (%s)", need, needWhy[need]), ExcludedCapability
		case t.MaxContext > 0 && a.PromptTokens()+a.MaxTokens() > t.MaxContext:
			why, kind = fmt.Sprintf("context window %d tokens < %d needed", t.MaxContext, a.PromptTokens()+a.MaxTokens()), ExcludedContext
		case capped && cost > maxCost:
			why, kind = fmt.Sprintf("expected cost %.3g USD over the policy limit %g", cost, maxCost), ExcludedPolicy
		case s.HasMaxCost && cost > s.MaxCostUSD:
			why, kind = fmt.Sprintf("expected cost %.3g USD over X-Molly-Max-Cost %g", cost, s.MaxCostUSD), ExcludedCost
		case t.MissingKey() != "":
			why, kind = "no API key: "+t.MissingKey(), ExcludedKey
		case s.Health != nil:
			if ok, reason := s.Health.Admit(t.Name); !ok {
				why, kind = reason, ExcludedHealth
			}
		}
		if why != "" {
			excluded = append(excluded, Exclusion{Target: t.Name, Reason: why, Kind: kind, Need: need})
			continue
		}
		lat := t.LatencyMS / 1000
		if l, ok := s.Priors.Latency(t.Name, a.Stream()); ok {
			lat = l
		}
		penalty := 0.0
		if s.Prefer == PreferLocal {
			penalty = LocalPenalty * float64(slices.Index(policies.Tiers, t.Tier))
		}
		cand := func(model string, seed float64) Candidate {
			key := PriorKey{Target: t.Name, Model: model, Category: a.Task()}
			q, n := s.Priors.Quality(key, seed)
			return Candidate{Target: t, Model: model, Quality: q, CostUSD: cost, LatencyS: lat,
				Score: q - w.Cost*cost - w.Latency*lat - penalty, Key: key, Learned: n}
		}
		if variant, ok := t.adapterVariant(up, a.Task()); ok {
			cands = append(cands, cand(variant, t.seed(variant, a.Task())))
		}
		cands = append(cands, cand(up, t.seed(up, a.Task())))
	}
	if s.Budgeted {
		cands, excluded = withinBudget(cands, excluded, s.RemainingUSD, a.PromptBound(), out)
	}
	tierIdx := func(t string) int { return slices.Index(policies.Tiers, t) }
	sort.SliceStable(cands, func(i, j int) bool {
		if cands[i].Score != cands[j].Score {
			return cands[i].Score > cands[j].Score
		}
		return tierIdx(cands[i].Target.Tier) < tierIdx(cands[j].Target.Tier) // ties go to the more local tier
	})
	return cands, excluded, known
}

// CompletionTokens is the completion budget of one answer to a: its
// max_tokens (DefaultCompletionTokens when unset, 0 for embeddings) times
// the choices it generates (n, best_of).
func CompletionTokens(a *classify.Annotation) int {
	if a.Endpoint() == openai.EndpointEmbeddings {
		return 0
	}
	out := a.MaxTokens()
	if out == 0 {
		out = DefaultCompletionTokens
	}
	return out * a.Choices()
}

// withinBudget drops the candidates whose worst case — prompt tokens (the
// prompt's bound, classify.Annotation.PromptBound) and out completion
// tokens at the target's prices, what the plan's reservation holds for an
// answer from it — exceeds remaining USD, each target once in excluded,
// when at least one candidate fits; otherwise it returns cands unchanged
// (see Selection.Budgeted). The worst case rather than the expected cost,
// so that a candidate kept here never makes the reservation refuse a
// request another candidate could serve within the budget.
func withinBudget(cands []Candidate, excluded []Exclusion, remaining float64, prompt, out int) ([]Candidate, []Exclusion) {
	worst := func(c Candidate) float64 { return c.Target.Cost(prompt, out) }
	if !slices.ContainsFunc(cands, func(c Candidate) bool { return worst(c) <= remaining }) {
		return cands, excluded
	}
	var kept []Candidate
	for _, c := range cands {
		if worst(c) <= remaining {
			kept = append(kept, c)
			continue
		}
		if !slices.ContainsFunc(excluded, func(e Exclusion) bool { return e.Target == c.Target.Name }) {
			excluded = append(excluded, Exclusion{Target: c.Target.Name, Kind: ExcludedBudget,
				Reason: fmt.Sprintf("worst-case cost %.6f USD over the remaining budget %.6f", worst(c), remaining)})
		}
	}
	return kept, excluded
}

func modalitiesOK(need, have []string) bool {
	for _, m := range need {
		if !slices.Contains(have, m) {
			return false
		}
	}
	return true
}
