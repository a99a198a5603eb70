package router

import (
	"fmt"
	"math"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/molly-gateway/molly/policies"
)

// HeaderMixture explains a mixture's answer: "best=<target>/<model>", then
// each member in ranking order, "<target>/<model> fused=<f>" (4 decimals)
// or "<target>/<model> failed", joined by ", ", then "cost_usd=<c>", the
// USD every member's answer cost together (6 decimals); parts are joined
// by "; ". Example:
// "best=lan/m; lan/m fused=0.2220, remote/m fused=0.0337; cost_usd=0.000012".
const HeaderMixture = "X-Molly-Mixture"

// Mixture defaults.
const (
	// DefaultMixtureK is how many candidates a mixture asks.
	DefaultMixtureK = 2
	// DefaultMixtureEntropy (nats) is the entropy of the category
	// distribution above which a mixture answers when the config sets
	// none: a little under a two-way tie (ln 2 ≈ 0.69).
	DefaultMixtureEntropy = 0.6
	// UnknownConfidence is the confidence of an answer whose backend gave
	// no logprobs: neutral between sure (1) and unsure (0).
	UnknownConfidence = 0.5
)

// Mixture configures answering by several candidates at once when the
// capability estimator cannot tell the task's category (the entropy of its
// category distribution, Annotation.TaskEntropy, is above Entropy): the
// top K allowed candidates whose expected costs together fit the budget
// are asked in parallel and the answers are ranked by
//
//	fused = routing weight × quality prior × confidence
//
// where the routing weight is e^(score − best score) (1 for the best
// ranked), the quality prior is the candidate's, and the confidence is
// e^(mean token log-probability), the geometric-mean token probability
// (UnknownConfidence without logprobs). The best is returned: the
// selection half of LLM-Blender (Jiang, Ren and Lin, "LLM-Blender:
// Ensembling Large Language Models with Pairwise Ranking and Generative
// Fusion", ACL 2023), with the priors standing in for its pairwise ranker;
// generative fusion of complementary answers is not done. Every member's
// usage is recorded and its cost counted. Non-streamed chat requests only.
type Mixture struct {
	// Entropy is the threshold in nats (≥ 0): a request whose category
	// entropy is above it gets a mixture.
	Entropy float64 `json:"entropy"`
	// K is how many candidates to ask, at least 2; 0 means DefaultMixtureK.
	K int `json:"k,omitempty"`
}

// Validate checks the settings; errors name the field.
func (m *Mixture) Validate() error {
	switch {
	case m == nil:
		return nil
	case !(m.Entropy >= 0) || math.IsInf(m.Entropy, 0):
		return fmt.Errorf("mixture: entropy %v must be a number of nats ≥ 0", m.Entropy)
	case m.K != 0 && m.K < 2:
		return fmt.Errorf("mixture: k %d must be at least 2", m.K)
	}
	return nil
}

// mixtureMembers picks the mixture's members from cands (ranked): the best
// K in order, skipping one whose expected cost would take the members'
// total over the budget — the least of the caller's remaining budget, the
// policy's max_cost_usd and X-Molly-Max-Cost. rest are the candidates not
// picked. Fewer than two members means no mixture.
func (f *Forwarder) mixtureMembers(r *http.Request, a *Annotation, d *policies.Decision, cands []Candidate) (members, rest []Candidate) {
	m := f.Mixture
	if m == nil || a.Endpoint != EndpointChat || a.Stream || len(cands) < 2 || !(a.TaskEntropy > m.Entropy) {
		return nil, cands
	}
	k := m.K
	if k == 0 {
		k = DefaultMixtureK
	}
	budget := math.Inf(1)
	if id := IdentityFrom(r.Context()); id != nil && id.Budgeted {
		budget = id.RemainingUSD
	}
	if c, ok := d.MaxCostUSD(); ok {
		budget = min(budget, c)
	}
	if o, err := ParseOverrides(r.Header); err == nil && o.HasMaxCost {
		budget = min(budget, o.MaxCostUSD)
	}
	total := 0.0
	for _, c := range cands {
		if len(members) < k && total+c.CostUSD <= budget {
			members = append(members, c)
			total += c.CostUSD
			continue
		}
		rest = append(rest, c)
	}
	if len(members) < 2 {
		return nil, cands
	}
	return members, rest
}

// fusedScore is an answer's rank in a mixture (see Mixture); best is the
// best ranked member's selection score.
func fusedScore(o outcome, best float64) (fused, weight, confidence float64) {
	weight = math.Exp(o.cand.Score - best)
	confidence = UnknownConfidence
	if o.tokens > 0 {
		confidence = math.Exp(o.logprob)
	}
	return weight * o.cand.Quality * confidence, weight, confidence
}

// mixture asks members in parallel and writes the best 2xx answer (done),
// or, when none gave one, the first non-2xx answer (done). When every
// member failed it writes nothing and returns the failures for the
// sequential path to go on from.
func (f *Forwarder) mixture(w http.ResponseWriter, r *http.Request, a *Annotation, d *policies.Decision, members []Candidate, log *zap.Logger) (tried []attempt, done bool) {
	begin := time.Now()
	outs := make([]outcome, len(members))
	var wg sync.WaitGroup
	for i, c := range members {
		wg.Go(func() { outs[i] = f.try(r.Context(), log, a, d, c) })
	}
	wg.Wait()
	if r.Context().Err() != nil {
		return nil, true // the client went away; nothing to answer
	}
	best, bestFused, firstOther := -1, 0.0, -1
	parts := make([]string, len(outs))
	var logged []string
	spentUSD := 0.0
	for i, o := range outs {
		switch {
		case o.failure != "":
			tried = append(tried, attempt{o.cand.Target.Name, o.failure})
			parts[i] = o.label() + " failed"
			logged = append(logged, o.label()+" failed: "+o.failure)
			continue
		case o.status/100 != 2:
			if firstOther < 0 {
				firstOther = i
			}
			parts[i] = fmt.Sprintf("%s HTTP %d", o.label(), o.status)
			logged = append(logged, parts[i])
			continue
		}
		if o.usage != nil {
			spentUSD += o.usage.CostUSD
		}
		fused, weight, conf := fusedScore(o, members[0].Score)
		parts[i] = fmt.Sprintf("%s fused=%.4f", o.label(), fused)
		logged = append(logged, fmt.Sprintf("%s weight=%.4f q=%.4f confidence=%.4f fused=%.4f", o.label(), weight, o.cand.Quality, conf, fused))
		if best < 0 || fused > bestFused {
			best, bestFused = i, fused
		}
	}
	chosen := best
	if chosen < 0 {
		chosen = firstOther
	}
	if chosen < 0 {
		log.Warn("mixture: every member failed, falling back", zap.String("decision_id", d.ID()), zap.Strings("members", logged))
		return tried, false
	}
	for i, o := range outs {
		if i != chosen && o.failure == "" && o.status/100 == 2 {
			f.spend(a, o)
		}
	}
	w.Header().Set(HeaderMixture, fmt.Sprintf("best=%s; %s; cost_usd=%.6f", outs[chosen].label(), strings.Join(parts, ", "), spentUSD))
	log.Info("mixture", zap.String("decision_id", d.ID()), zap.Float64("task_entropy", a.TaskEntropy), zap.Strings("members", logged),
		zap.String("answered", outs[chosen].label()), zap.Float64("cost_usd", spentUSD), zap.Duration("duration", time.Since(begin)))
	f.deliver(w, a, d, outs[chosen], slices.Clone(members), "mixture")
	return tried, true
}
