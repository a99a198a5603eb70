package router

import (
	"slices"
	"strings"
	"testing"
)

func TestSelectionHonoursTheRemainingBudget(t *testing.T) {
	_, cat := cascadeTiers(t, [3]float64{})
	a := classify(t, EndpointChat, chatBody("what is the capital of France?"), "")
	// Expected costs with 256 assumed completion tokens: lan 0, remote
	// ≈ 0.000026, cloud ≈ 0.00027 USD.
	cases := []struct {
		name         string
		tiers        []string
		budgeted     bool
		remaining    float64
		wantCands    []string
		wantExcluded string // substring of the exclusions
	}{
		{"without a budget every allowed candidate stays", []string{"T1", "T2", "T3"}, false, 0, []string{"cloud", "remote", "lan"}, ""},
		{"a budget under cloud's expected cost excludes cloud", []string{"T1", "T2", "T3"}, true, 0.0001, []string{"remote", "lan"},
			"cloud: expected cost 0.000270 USD over the remaining budget 0.000100"},
		{"a budget under every paid candidate leaves the free one", []string{"T1", "T2", "T3"}, true, 0.00001, []string{"lan"}, "remote: expected cost"},
		{"a budget no candidate fits keeps them all, for molly_auth to refuse once spent", []string{"T2", "T3"}, true, 0.00001, []string{"cloud", "remote"}, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			d := allowTiers(t, tc.tiers, nil)
			cands, excluded, _ := cat.RankWith(a, d, Selection{Weights: DefaultWeights, Budgeted: tc.budgeted, RemainingUSD: tc.remaining})
			var names, xs []string
			for _, c := range cands {
				names = append(names, c.Target.Name)
			}
			for _, e := range excluded {
				xs = append(xs, e.String())
			}
			if !slices.Equal(names, tc.wantCands) {
				t.Errorf("candidates %v, want %v", names, tc.wantCands)
			}
			joined := strings.Join(xs, "; ")
			if tc.wantExcluded != "" && !strings.Contains(joined, tc.wantExcluded) {
				t.Errorf("exclusions %q, want one containing %q", joined, tc.wantExcluded)
			}
			if tc.wantExcluded == "" && strings.Contains(joined, "budget") {
				t.Errorf("exclusions %q mention the budget", joined)
			}
		})
	}
}
