package eval

import (
	"math"
	"strings"
	"testing"
)

func scores(incumbent, candidate, baseGen, candGen float64) Scores {
	return Scores{IncumbentDomain: Score{NLL: incumbent}, CandidateDomain: Score{NLL: candidate},
		BaseGeneral: Score{NLL: baseGen}, CandidateGen: Score{NLL: candGen}}
}

// TestGate: relative gains and regressions against the defaults (10%
// margin, 1% budget) and configured values, figures worked by hand.
func TestGate(t *testing.T) {
	for _, tc := range []struct {
		name     string
		g        Gate
		s        Scores
		promote  bool
		gain     float64
		regress  float64
		inReason string
	}{
		{"a clear win", Gate{}, scores(2, 1.5, 4, 4.02), true, 0.25, 0.005, "25.0% lower"},
		{"under the margin", Gate{}, scores(2, 1.85, 4, 4), false, 0.075, 0, "margin is 10.0%"},
		{"over the regression budget", Gate{}, scores(2, 1, 4, 4.08), false, 0.5, 0.02, "regression budget is 1.0%"},
		{"general improves", Gate{}, scores(2, 1.7, 4, 3.5), true, 0.15, -0.125, ""},
		{"a stricter margin", Gate{Margin: 0.3}, scores(2, 1.5, 4, 4), false, 0.25, 0, "margin is 30.0%"},
		{"a looser budget", Gate{RegressionBudget: 0.05}, scores(2, 1, 4, 4.08), true, 0.5, 0.02, ""},
	} {
		v := tc.g.Judge(tc.s)
		if v.Promote != tc.promote || math.Abs(v.DomainGain-tc.gain) > 1e-12 || math.Abs(v.GeneralRegression-tc.regress) > 1e-12 ||
			!strings.Contains(v.Reason, tc.inReason) {
			t.Errorf("%s: %+v, want promote %v gain %v regression %v reason with %q", tc.name, v, tc.promote, tc.gain, tc.regress, tc.inReason)
		}
	}
}

// TestGeneralProbesShip: the embedded probes parse, each a prompt and an answer.
func TestGeneralProbesShip(t *testing.T) {
	ps := GeneralProbes()
	if len(ps) < 20 {
		t.Fatalf("%d general probes", len(ps))
	}
	for _, p := range ps {
		if len(p.Messages) == 0 || p.Answer == "" || p.Messages[len(p.Messages)-1].Role != "user" {
			t.Fatalf("probe %+v", p)
		}
	}
}
