package route

import (
	"fmt"
	"math"
	"slices"
)

// Cascade orders (Cascade.Order).
const (
	// OrderCheap tries the cheapest expected cost first; equal costs keep
	// the selection's ranking (the best of the cheap ones first).
	OrderCheap = "cheap"
	// OrderScore tries candidates in the selection's ranking.
	OrderScore = "score"
)

// Cascade defaults.
const (
	// DefaultCascadeThreshold is the mean token log-probability (nats per
	// token) below which an answer is escalated when the config sets none:
	// a geometric-mean token probability under e^-1 ≈ 0.37.
	DefaultCascadeThreshold = -1.0
	// DefaultCascadeAttempts bounds the answers one request may obtain.
	DefaultCascadeAttempts = 2
)

// Cascade configures LLM cascades after FrugalGPT (Chen, Zaharia and Zou,
// "FrugalGPT: How to Use Large Language Models While Reducing Cost and
// Improving Performance", 2023, arXiv:2305.05176): a non-streamed chat
// request goes to the cheapest allowed candidate first, and its answer is
// returned unless the escalation policy (policies/escalation.rego, given the
// answer's score and the remaining candidates) asks for the next one. The
// score is the answer's mean token log-probability (Molly asks the upstream
// for "logprobs": true and removes them from the answer when the client did
// not ask) or, with SelfCheck, the target's rating of its own answer.
// Candidates come only from the policy decision's ranking, so escalation
// never leaves the allowed tiers. A streamed request is cascaded only with
// HoldTokens set: its first tokens are held back from the client and scored
// the same way.
type Cascade struct {
	// Threshold is the mean token log-probability, in nats per token (≤ 0),
	// an answer needs to be returned; below it the request escalates.
	Threshold float64 `json:"threshold"`
	// MaxAttempts bounds the answers obtained, escalations included
	// (upstream failures that fall back do not count); 0 means
	// DefaultCascadeAttempts. The last answer is returned whatever its score.
	MaxAttempts int `json:"max_attempts,omitempty"`
	// Order is OrderCheap (default, "") or OrderScore.
	Order string `json:"order,omitempty"`
	// HoldTokens, when above 0, cascades streamed chat requests too: each
	// attempt's stream is read, and nothing of it sent, until HoldTokens
	// tokens with logprobs arrived or it ended. 0: streams are not cascaded.
	HoldTokens int `json:"hold_tokens,omitempty"`
	// SelfCheck scores non-streamed chat answers that come without logprobs
	// by asking the same target, in the same conversation as it saw it
	// (redacted for its tier), how confident it is from 0 to 10 (the
	// self-evaluation of Kadavath et al. 2022, "Language Models (Mostly)
	// Know What They Know"). The answer c becomes the score ln(c/10), in the
	// same nats as Threshold: c=6 gives −0.51. Its tokens are recorded.
	SelfCheck bool `json:"self_check,omitempty"`
}

// Validate checks the settings; errors name the field.
func (c *Cascade) Validate() error {
	switch {
	case c == nil:
		return nil
	case !(c.Threshold <= 0) || math.IsInf(c.Threshold, 0):
		return fmt.Errorf("cascade: threshold %v must be a mean log-probability ≤ 0, such as -1.5", c.Threshold)
	case c.MaxAttempts < 0:
		return fmt.Errorf("cascade: max_attempts %d must be at least 1", c.MaxAttempts)
	case c.Order != "" && c.Order != OrderCheap && c.Order != OrderScore:
		return fmt.Errorf("cascade: order %q must be cheap or score", c.Order)
	case c.HoldTokens < 0:
		return fmt.Errorf("cascade: hold_tokens %d must be 0 (streams are not cascaded) or more", c.HoldTokens)
	}
	return nil
}

// Attempts is the most answers one request may obtain.
func (c *Cascade) Attempts() int {
	if c.MaxAttempts > 0 {
		return c.MaxAttempts
	}
	return DefaultCascadeAttempts
}

// order returns the candidates in the order the cascade tries them.
func (c *Cascade) order(cands []Candidate) []Candidate {
	out := slices.Clone(cands)
	if c.Order != OrderScore {
		slices.SortStableFunc(out, func(x, y Candidate) int {
			switch {
			case x.CostUSD < y.CostUSD:
				return -1
			case x.CostUSD > y.CostUSD:
				return 1
			}
			return 0
		})
	}
	return out
}

// Mixture defaults.
const (
	// DefaultMixtureK is how many candidates a mixture asks.
	DefaultMixtureK = 2
	// DefaultMixtureEntropy (nats) is the entropy of the category
	// distribution above which a mixture answers when the config sets
	// none: a little under a two-way tie (ln 2 ≈ 0.69).
	DefaultMixtureEntropy = 0.6
)

// Mixture configures answering by several candidates at once when the
// capability estimator cannot tell the task's category (the entropy of its
// category distribution is above Entropy): the top K allowed candidates
// whose expected costs together fit the budget are asked in parallel and
// the answers ranked by routing weight × quality prior × confidence (the
// selection half of LLM-Blender, Jiang, Ren and Lin, ACL 2023).
// Non-streamed chat requests only.
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

func (m *Mixture) k() int {
	if m.K > 0 {
		return m.K
	}
	return DefaultMixtureK
}

// members picks the mixture's members from cands (ranked): the best K in
// order, skipping one whose expected cost would take the members' total
// over budget (USD; +Inf for none). Fewer than two means no mixture.
func (m *Mixture) members(cands []Candidate, budget float64) (members, rest []Candidate) {
	total := 0.0
	for _, c := range cands {
		if len(members) < m.k() && total+c.CostUSD <= budget {
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
