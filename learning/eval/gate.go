package eval

import (
	"bufio"
	"bytes"
	_ "embed"
	"encoding/json"
	"fmt"
	"io"

	"github.com/molly-gateway/molly/learning/lora"
)

// Gate decides promotion. Gains and regressions are relative changes of
// mean NLL per token.
type Gate struct {
	// Margin is the least relative improvement of held-out domain NLL over
	// the incumbent (the adapter serving the domain now, or the base) a
	// candidate needs: 0.1 means at least 10% lower. Default 0.1.
	Margin float64 `json:"margin,omitempty"`
	// RegressionBudget is the most relative increase of general-probe NLL
	// over the base model allowed: 0.01 means at most 1% higher. Default
	// 0.01.
	RegressionBudget float64 `json:"regression_budget,omitempty"`
}

// Defaults of Gate.
const (
	DefaultMargin           = 0.10
	DefaultRegressionBudget = 0.01
)

func (g Gate) margin() float64 {
	if g.Margin > 0 {
		return g.Margin
	}
	return DefaultMargin
}

func (g Gate) budget() float64 {
	if g.RegressionBudget > 0 {
		return g.RegressionBudget
	}
	return DefaultRegressionBudget
}

// Scores are what the gate judges: held-out domain and general probes,
// each for the incumbent (domain), the base (general) and the candidate.
type Scores struct {
	IncumbentDomain Score `json:"incumbent_domain"`
	CandidateDomain Score `json:"candidate_domain"`
	BaseGeneral     Score `json:"base_general"`
	CandidateGen    Score `json:"candidate_general"`
}

// Verdict is the gate's answer with the figures behind it.
type Verdict struct {
	Promote bool `json:"promote"`
	// DomainGain is 1 − candidate/incumbent domain NLL (0.25: 25% lower);
	// GeneralRegression is candidate/base general NLL − 1 (negative: better).
	DomainGain        float64 `json:"domain_gain"`
	GeneralRegression float64 `json:"general_regression"`
	Reason            string  `json:"reason"`
}

// Judge applies the gate to s.
func (g Gate) Judge(s Scores) Verdict {
	v := Verdict{
		DomainGain:        1 - s.CandidateDomain.NLL/s.IncumbentDomain.NLL,
		GeneralRegression: s.CandidateGen.NLL/s.BaseGeneral.NLL - 1,
	}
	switch {
	case v.DomainGain < g.margin():
		v.Reason = fmt.Sprintf("domain NLL %.4f is %.1f%% below the incumbent's %.4f; the margin is %.1f%%",
			s.CandidateDomain.NLL, 100*v.DomainGain, s.IncumbentDomain.NLL, 100*g.margin())
	case v.GeneralRegression > g.budget():
		v.Reason = fmt.Sprintf("general NLL %.4f is %.1f%% above the base's %.4f; the regression budget is %.1f%%",
			s.CandidateGen.NLL, 100*v.GeneralRegression, s.BaseGeneral.NLL, 100*g.budget())
	default:
		v.Promote = true
		v.Reason = fmt.Sprintf("domain NLL %.1f%% lower than the incumbent's, general NLL %+.1f%% against the base",
			100*v.DomainGain, 100*v.GeneralRegression)
	}
	return v
}

//go:embed general.jsonl
var generalProbes []byte

// Pair is one chat exchange: the prompt messages and the reference answer.
type Pair struct {
	Messages []Message `json:"messages"`
	Answer   string    `json:"answer"`
}

// GeneralProbes are the fixed general probes shipped with Molly: short
// everyday questions and tasks with reference answers, none of them from
// a user, against which an adapter's regression on what it was not
// trained for is measured.
func GeneralProbes() []Pair {
	ps, err := ReadJSONL(bytes.NewReader(generalProbes))
	if err != nil {
		panic(err) // embedded and tested
	}
	return ps
}

// ReadJSONL reads OpenAI chat fine-tuning JSONL ({"messages": [...]} per
// line, the last message the assistant's answer). Errors name the line.
func ReadJSONL(r io.Reader) ([]Pair, error) {
	var out []Pair
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	line := 0
	for sc.Scan() {
		line++
		b := bytes.TrimSpace(sc.Bytes())
		if len(b) == 0 {
			continue
		}
		var row struct {
			Messages []Message `json:"messages"`
		}
		if err := json.Unmarshal(b, &row); err != nil {
			return nil, fmt.Errorf("line %d: %w", line, err)
		}
		n := len(row.Messages)
		if n < 2 || row.Messages[n-1].Role != "assistant" {
			return nil, fmt.Errorf("line %d: want messages ending with the assistant's answer", line)
		}
		out = append(out, Pair{Messages: row.Messages[:n-1], Answer: row.Messages[n-1].Content})
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	return out, nil
}

// EncodeAll encodes pairs with e (Encode).
func (e *Evaluator) EncodeAll(ps []Pair) ([]lora.Example, error) {
	out := make([]lora.Example, 0, len(ps))
	for i, p := range ps {
		ex, err := e.Encode(p.Messages, p.Answer)
		if err != nil {
			return nil, fmt.Errorf("pair %d: %w", i, err)
		}
		out = append(out, ex)
	}
	return out, nil
}
