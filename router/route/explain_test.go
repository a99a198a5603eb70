package route

import (
	"fmt"
	"math"
	"testing"
)

// Describe and RouteHeader write numbers with strconv; the oracle is the
// fmt format they replaced.
func TestDescribeAndRouteHeaderWriteNumbersAsFmt(t *testing.T) {
	lan, ext := &Target{Name: "lan"}, &Target{Name: "ext-eu"}
	for _, c := range []Candidate{
		{Target: lan, Model: "m", Quality: 0.7, CostUSD: 0.002, LatencyS: 1, Score: 0.63},
		{Target: ext, Model: "gpt-x", Quality: 0.123456, Learned: 3, CostUSD: 1.5e-7, LatencyS: 0.00049, Score: -0.00005},
		{Target: lan, Model: "", Quality: math.NaN(), CostUSD: math.Inf(1), LatencyS: math.Inf(-1), Score: 12345.67895},
		{Target: ext, Model: "a/b", Quality: -0.0, Learned: 1, CostUSD: 99999999.9999995, LatencyS: 2.0005, Score: 1},
	} {
		src := "config"
		if c.Learned > 0 {
			src = fmt.Sprintf("learned %d", c.Learned)
		}
		want := fmt.Sprintf("%s/%s q=%.4f (%s) cost=%.6f lat=%.3f score=%.4f", c.Target.Name, c.Model, c.Quality, src, c.CostUSD, c.LatencyS, c.Score)
		if got := Describe(c); got != want {
			t.Errorf("Describe = %q, want %q", got, want)
		}
	}
	a := Candidate{Target: lan, Model: "m", Score: 0.63333}
	b := Candidate{Target: ext, Model: "x", Score: math.NaN()}
	ex := []Exclusion{{Target: "t3", Reason: "tier T3 not allowed\n"}}
	for _, tc := range []struct {
		chosen Candidate
		cands  []Candidate
		want   string
	}{
		{a, []Candidate{a, b}, "lan/m score=0.6333; runner-up ext-eu/x score=NaN; excluded t3: tier T3 not allowed?"},
		{b, []Candidate{a, b}, "ext-eu/x score=NaN; runner-up lan/m score=0.6333; fallback; excluded t3: tier T3 not allowed?"},
		{a, []Candidate{a}, "lan/m score=0.6333; runner-up none; excluded t3: tier T3 not allowed?"},
	} {
		if got := RouteHeader(tc.chosen, tc.cands, ex); got != tc.want {
			t.Errorf("RouteHeader = %q, want %q", got, tc.want)
		}
	}
}
