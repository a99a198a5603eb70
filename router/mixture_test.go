package router

import (
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"slices"
	"testing"

	"github.com/tidwall/gjson"
)

func TestMixtureFusesTheBestOfK(t *testing.T) {
	const flat = "Summarise and translate this text" // summarisation and translation tie
	const sure = "hello"                             // chat alone
	ups, cat := cascadeTiers(t, [3]float64{-0.1, -0.1, -3})
	ledger := &memLedger{}
	f := &Forwarder{Catalogue: cat, Weights: DefaultWeights, Mixture: &Mixture{Entropy: DefaultMixtureEntropy, K: 2}}
	gw := forwarderGateway(t, f, &Identity{Member: "alice", Ledger: ledger})

	a := classify(t, EndpointChat, chatBody(flat), "")
	if a.TaskEntropy <= DefaultMixtureEntropy {
		t.Fatalf("TaskEntropy of %q = %.4f, want above %v", flat, a.TaskEntropy, DefaultMixtureEntropy)
	}
	cands, _, _ := cat.Rank(a, decideDefault(t, defaultEngine(t), a, cat), DefaultWeights)
	if len(cands) != 3 || cands[0].Target.Name != "cloud" || cands[1].Target.Name != "remote" {
		t.Fatalf("ranking %v, want cloud, remote, lan", cands)
	}

	t.Run("a flat category distribution asks the top k and returns the best by weight × prior × confidence", func(t *testing.T) {
		r := post(t, gw.URL+"/v1/chat/completions", chatBody(flat))
		if r.status != 200 || r.header.Get(HeaderTarget) != "remote" {
			t.Fatalf("status %d target %q: %s", r.status, r.header.Get(HeaderTarget), r.body)
		}
		// cloud: weight 1, prior 0.9, confidence e^-3; remote: e^(Δscore), 0.6, e^-0.1.
		cloud := 0.9 * math.Exp(-3)
		remote := math.Exp(cands[1].Score-cands[0].Score) * 0.6 * math.Exp(-0.1)
		want := fmt.Sprintf("best=remote/m; cloud/m fused=%.4f, remote/m fused=%.4f; cost_usd=0.000011", cloud, remote)
		if got := r.header.Get(HeaderMixture); got != want {
			t.Errorf("%s = %q, want %q", HeaderMixture, got, want)
		}
		if got := gjson.Get(r.body, "choices.0.message.content").String(); got != "remote says: "+flat {
			t.Errorf("answer %q", got)
		}
		if lp := gjson.Get(r.body, "choices.0.logprobs"); lp.Type != gjson.Null {
			t.Errorf("logprobs the client did not ask for were returned: %s", lp.Raw)
		}
		if ups[0].Count() != 0 || ups[1].Count() != 1 || ups[2].Count() != 1 {
			t.Errorf("requests lan %d remote %d cloud %d, want 0 1 1", ups[0].Count(), ups[1].Count(), ups[2].Count())
		}
		got := ledger.take()
		var targets []string
		var total float64
		for _, u := range got {
			targets = append(targets, u.Target)
			total += u.CostUSD
		}
		slices.Sort(targets)
		// 5 prompt + 5 completion tokens: cloud 10 × 1 USD/1M, remote 10 × 0.1 USD/1M.
		if !slices.Equal(targets, []string{"cloud", "remote"}) || math.Abs(total-0.000011) > 1e-12 {
			t.Errorf("usage recorded for %v costing %v USD, want cloud and remote costing 0.000011", targets, total)
		}
	})

	t.Run("a sure category is routed to one target", func(t *testing.T) {
		before := ups[2].Count()
		r := post(t, gw.URL+"/v1/chat/completions", chatBody(sure))
		if r.status != 200 || r.header.Get(HeaderTarget) != "cloud" || r.header.Get(HeaderMixture) != "" {
			t.Fatalf("status %d target %q mixture %q", r.status, r.header.Get(HeaderTarget), r.header.Get(HeaderMixture))
		}
		if ups[1].Count() != 1 || ups[2].Count() != before+1 {
			t.Errorf("remote %d cloud %d requests, want only cloud asked", ups[1].Count(), ups[2].Count()-before)
		}
		if got := ledger.take(); len(got) != 1 {
			t.Errorf("%d usage records, want 1", len(got))
		}
	})
}

func TestMixtureMembers(t *testing.T) {
	tg := &Target{Name: "t", Tier: "T1"}
	cands := []Candidate{{Target: tg, Model: "a", CostUSD: 0.3}, {Target: tg, Model: "b", CostUSD: 0.2}, {Target: tg, Model: "c", CostUSD: 0.1}}
	d := allowTiers(t, []string{"T1"}, nil)
	cases := []struct {
		name        string
		entropy     float64
		id          *Identity
		maxCost     string
		wantMembers []string
		wantRest    []string
	}{
		{"without a budget the top k are the members", 1, nil, "", []string{"a", "b"}, []string{"c"}},
		{"a member that would overrun the remaining budget is skipped", 1, &Identity{Budgeted: true, RemainingUSD: 0.45}, "", []string{"a", "c"}, []string{"b"}},
		{"X-Molly-Max-Cost bounds the members' total below the remaining budget", 1, &Identity{Budgeted: true, RemainingUSD: 10}, "0.45", []string{"a", "c"}, []string{"b"}},
		{"a budget only one candidate fits means no mixture", 1, &Identity{Budgeted: true, RemainingUSD: 0.15}, "", nil, []string{"a", "b", "c"}},
		{"an entropy at the threshold means no mixture", 0.6, nil, "", nil, []string{"a", "b", "c"}},
	}
	models := func(cs []Candidate) []string {
		var out []string
		for _, c := range cs {
			out = append(out, c.Model)
		}
		return out
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := &Forwarder{Mixture: &Mixture{Entropy: 0.6}}
			r := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", nil)
			if tc.maxCost != "" {
				r.Header.Set(HeaderMaxCost, tc.maxCost)
			}
			if tc.id != nil {
				r = r.WithContext(WithIdentity(r.Context(), tc.id))
			}
			a := &Annotation{Capability: Capability{Endpoint: EndpointChat, TaskEntropy: tc.entropy}}
			members, rest := f.mixtureMembers(r, a, d, cands)
			if !slices.Equal(models(members), tc.wantMembers) || !slices.Equal(models(rest), tc.wantRest) {
				t.Fatalf("members %v rest %v, want %v and %v", models(members), models(rest), tc.wantMembers, tc.wantRest)
			}
		})
	}
}

func TestMixtureSettingsAreValidated(t *testing.T) {
	cases := []struct {
		name    string
		mixture Mixture
		wantErr bool
	}{
		{"an entropy with the default k is valid", Mixture{Entropy: 0.6}, false},
		{"a negative entropy is refused", Mixture{Entropy: -0.1}, true},
		{"k of one is refused", Mixture{Entropy: 0.6, K: 1}, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.mixture.Validate(); (err != nil) != tc.wantErr {
				t.Fatalf("Validate() = %v, want error: %v", err, tc.wantErr)
			}
		})
	}
}
