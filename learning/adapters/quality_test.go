package adapters

import (
	"math"
	"testing"

	"github.com/molly-gateway/molly/learning/eval"
)

// TestPromotedQuality: values worked by hand from q' = 1 − (1 − q)·NLL_c/NLL_i.
func TestPromotedQuality(t *testing.T) {
	sc := func(inc, cand float64) eval.Scores {
		return eval.Scores{IncumbentDomain: eval.Score{NLL: inc}, CandidateDomain: eval.Score{NLL: cand}}
	}
	for _, tc := range []struct {
		q         float64
		s         eval.Scores
		want      float64
		situation string
	}{
		{0.5, sc(2, 1), 0.75, "half the loss gone closes half the gap"},
		{0.9, sc(14.957, 0.715), 1 - 0.1*0.715/14.957, "a configured 0.9 is never lowered"},
		{0.3, sc(1.5, 1.5), 0.3, "an equal loss keeps the prior"},
		{0.3, sc(1.5, 3), 0.3, "a worse loss never lowers it"},
		{0.2, sc(4, 0), 1, "no loss left reaches 1"},
		{0.4, eval.Scores{}, 0.4, "no incumbent score leaves it"},
	} {
		if got := PromotedQuality(tc.q, tc.s); math.Abs(got-tc.want) > 1e-12 {
			t.Errorf("%s: PromotedQuality(%v) = %v, want %v", tc.situation, tc.q, got, tc.want)
		}
	}
}
