package route

import (
	"fmt"
	"math"
	"net/http"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/molly-gateway/molly/router/classify"
	"github.com/molly-gateway/molly/router/openai"
)

// rankTargets are three alternatives for model "m" with known score terms
// for a request of 1000 prompt and 500 completion tokens (task chat):
//
//	local: q 0.6, cost 0,                              latency 2 s   → 0.6 − 0     − 0.1   = 0.5
//	lan:   q 0.7, cost (1000·1+500·2)/1e6 = 0.002,     latency 1 s   → 0.7 − 0.02  − 0.05  = 0.63
//	cloud: q 0.9, cost (1000·5+500·15)/1e6 = 0.0125,   latency 0.5 s → 0.9 − 0.125 − 0.025 = 0.75
func rankTargets() []*Target {
	return []*Target{
		{Name: "local", Tier: "T0", Endpoint: "http://127.0.0.1:1/v1", Models: []string{"m=local-m", "small"},
			LatencyMS: 2000, Quality: map[string]float64{"default": 0.6}},
		{Name: "lan", Tier: "T1", Endpoint: "http://127.0.0.1:2/v1", Models: []string{"m", "big"},
			PriceIn: 1, PriceOut: 2, LatencyMS: 1000, Quality: map[string]float64{"chat": 0.7, "default": 0.1}},
		{Name: "cloud", Tier: "T3", Endpoint: "https://api.example.com/v1", Models: []string{"m=gpt-m", "gpt"}, Region: "US",
			PriceIn: 5, PriceOut: 15, LatencyMS: 500, Quality: map[string]float64{"default": 0.9}},
	}
}

// rankRequest is a chat request of 1000 prompt tokens asking for 500.
func rankRequest() request { return request{maxTokens: 500, text: "hello "} }

type ranked struct {
	Target, Model             string
	Quality, Cost, Lat, Score float64
}

func rankedOf(cands []Candidate) []ranked {
	var out []ranked
	for _, c := range cands {
		out = append(out, ranked{c.Target.Name, c.Model, c.Quality, c.CostUSD, c.LatencyS, c.Score})
	}
	return out
}

func sameRanked(a, b []ranked) bool {
	if len(a) != len(b) {
		return false
	}
	near := func(x, y float64) bool { return math.Abs(x-y) < 1e-12 }
	for i := range a {
		if a[i].Target != b[i].Target || a[i].Model != b[i].Model || !near(a[i].Quality, b[i].Quality) ||
			!near(a[i].Cost, b[i].Cost) || !near(a[i].Lat, b[i].Lat) || !near(a[i].Score, b[i].Score) {
			return false
		}
	}
	return true
}

var (
	rLocal = ranked{"local", "local-m", 0.6, 0, 2, 0.5}
	rLAN   = ranked{"lan", "m", 0.7, 0.002, 1, 0.63}
	rCloud = ranked{"cloud", "gpt-m", 0.9, 0.0125, 0.5, 0.75}
)

func withScore(r ranked, s float64) ranked { r.Score = s; return r }

func TestRank(t *testing.T) {
	tests := []struct {
		name     string
		decision map[string]any
		req      func(r *request)
		targets  func(ts []*Target)
		weights  Weights
		want     []ranked
		excluded []Exclusion
	}{
		{"every tier allowed: the objective orders cloud, lan, local",
			allow(allTiers, nil), nil, nil, DefaultWeights,
			[]ranked{rCloud, rLAN, rLocal}, nil},
		{"a tier the policy does not allow is excluded",
			allow([]string{"T0", "T1", "T2"}, nil), nil, nil, DefaultWeights,
			[]ranked{rLAN, rLocal}, []Exclusion{{"cloud", "tier T3 not allowed by the policy", ExcludedPolicy, ""}}},
		{"a denial excludes every target",
			map[string]any{"allow": false, "tiers": []any{"T0"}, "reasons": []any{"no"}}, nil, nil, DefaultWeights,
			nil, []Exclusion{{"local", "tier T0 not allowed by the policy", ExcludedPolicy, ""}, {"lan", "tier T1 not allowed by the policy", ExcludedPolicy, ""}, {"cloud", "tier T3 not allowed by the policy", ExcludedPolicy, ""}}},
		{"a region outside the decision's regions is excluded",
			allow(allTiers, map[string]any{"regions": []any{"EU", "local"}}), nil, nil, DefaultWeights,
			[]ranked{rLAN, rLocal}, []Exclusion{{"cloud", `region "US" outside the allowed regions EU,local`, ExcludedPolicy, ""}}},
		{"a target in the decision's region stays",
			allow(allTiers, map[string]any{"regions": []any{"US"}}), nil, nil, DefaultWeights,
			[]ranked{rCloud}, []Exclusion{{"local", `region "local" outside the allowed regions US`, ExcludedPolicy, ""}, {"lan", `region "local" outside the allowed regions US`, ExcludedPolicy, ""}}},
		{"a target without the request's modality is excluded",
			allow(allTiers, nil), func(r *request) { r.image = true }, func(ts []*Target) { ts[2].Modalities = []string{"text", "image"} }, DefaultWeights,
			[]ranked{rCloud}, []Exclusion{{"local", "accepts text, request needs text,image", ExcludedModality, ""}, {"lan", "accepts text, request needs text,image", ExcludedModality, ""}}},
		{"a context window smaller than prompt plus completion is excluded",
			allow(allTiers, nil), nil, func(ts []*Target) { ts[2].MaxContext = 1499; ts[1].MaxContext = 1500 }, DefaultWeights,
			[]ranked{rLAN, rLocal}, []Exclusion{{"cloud", "context window 1499 tokens < 1500 needed", ExcludedContext, ""}}},
		{"a target that does not serve the endpoint is excluded",
			allow(allTiers, nil), nil, func(ts []*Target) { ts[1].Endpoints = []string{"embeddings"} }, DefaultWeights,
			[]ranked{rCloud, rLocal}, []Exclusion{{"lan", "does not serve chat.completions (serves embeddings)", ExcludedEndpoint, ""}}},
		{"an expected cost over max_cost_usd is excluded",
			allow(allTiers, map[string]any{"max_cost_usd": 0.005}), nil, nil, DefaultWeights,
			[]ranked{rLAN, rLocal}, []Exclusion{{"cloud", "expected cost 0.0125 USD over the policy limit 0.005", ExcludedPolicy, ""}}},
		{"a cost equal to max_cost_usd is allowed",
			allow(allTiers, map[string]any{"max_cost_usd": 0.0125}), nil, nil, DefaultWeights,
			[]ranked{rCloud, rLAN, rLocal}, nil},
		{"a heavy cost weight prefers the free target",
			allow(allTiers, nil), nil, nil, Weights{Cost: 100, Latency: 0.05},
			[]ranked{rLocal, withScore(rLAN, 0.7-0.2-0.05), withScore(rCloud, 0.9-1.25-0.025)}, nil},
		{"zero weights order by quality alone",
			allow(allTiers, nil), nil, nil, Weights{},
			[]ranked{withScore(rCloud, 0.9), withScore(rLAN, 0.7), withScore(rLocal, 0.6)}, nil},
		{"without max_tokens the cost assumes DefaultCompletionTokens",
			allow(allTiers, nil), func(r *request) { r.maxTokens = 0 }, nil, Weights{Cost: 10},
			[]ranked{
				{"cloud", "gpt-m", 0.9, (1000*5 + 256*15) / 1e6, 0.5, 0.9 - 10*(1000*5+256*15)/1e6},
				{"lan", "m", 0.7, (1000*1 + 256*2) / 1e6, 1, 0.7 - 10*(1000*1+256*2)/1e6},
				{"local", "local-m", 0.6, 0, 2, 0.6},
			}, nil},
		{"n choices multiply the completion budget",
			allow(allTiers, nil), func(r *request) { r.n = 2 }, nil, Weights{Cost: 10},
			[]ranked{
				{"cloud", "gpt-m", 0.9, (1000*5 + 1000*15) / 1e6, 0.5, 0.9 - 10*(1000*5+1000*15)/1e6},
				{"lan", "m", 0.7, (1000*1 + 1000*2) / 1e6, 1, 0.7 - 10*(1000*1+1000*2)/1e6},
				{"local", "local-m", 0.6, 0, 2, 0.6},
			}, nil},
		{"embeddings cost the prompt only",
			allow(allTiers, nil), func(r *request) { r.ep, r.maxTokens = openai.EndpointEmbeddings, 0 }, nil, Weights{Cost: 10},
			[]ranked{{"cloud", "gpt-m", 0.9, 0.005, 0.5, 0.85}, {"local", "local-m", 0.6, 0, 2, 0.6}, {"lan", "m", 0.1, 0.001, 1, 0.09}}, nil},
		{"a task without its own prior uses default, then 0.5",
			allow(allTiers, nil), func(r *request) { r.text = "solve the equation x^2 = 4 " }, func(ts []*Target) { ts[2].Quality = nil }, Weights{},
			[]ranked{{"local", "local-m", 0.6, 0, 2, 0.6}, {"cloud", "gpt-m", 0.5, 0.0125, 0.5, 0.5}, {"lan", "m", 0.1, 0.002, 1, 0.1}}, nil},
		{"ties go to the more local tier whatever the declaration order",
			allow(allTiers, nil), nil, func(ts []*Target) {
				for _, t := range ts {
					t.Quality, t.PriceIn, t.PriceOut, t.LatencyMS = map[string]float64{"default": 0.8}, 0, 0, 0
				}
				ts[0], ts[2] = ts[2], ts[0]
			}, DefaultWeights,
			[]ranked{{"local", "local-m", 0.8, 0, 0, 0.8}, {"lan", "m", 0.8, 0, 0, 0.8}, {"cloud", "gpt-m", 0.8, 0, 0, 0.8}}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, ts := rankRequest(), rankTargets()
			if tt.req != nil {
				tt.req(&r)
			}
			if tt.targets != nil {
				tt.targets(ts)
			}
			a := annotate(t, nil, r)
			if r.text == "solve the equation x^2 = 4 " && a.Task() != "math" {
				t.Fatalf("the math request has task %q", a.Task())
			}
			c := newCatalogue(t, ts...)
			cands, excluded, known := c.Rank(a, decision(t, a, tt.decision), tt.weights)
			if !known {
				t.Fatal("known = false for a served model")
			}
			if got := rankedOf(cands); !sameRanked(got, tt.want) {
				t.Errorf("candidates =\n%v\nwant\n%v", got, tt.want)
			}
			if !reflect.DeepEqual(excluded, tt.excluded) {
				t.Errorf("excluded = %q\nwant       %q", excluded, tt.excluded)
			}
		})
	}
}

// TestATargetWithoutItsKeyIsExcluded: a target whose api_key_env names an
// unset (or empty) variable is never a candidate — excluded with the
// variable's name, after the request's own reasons — so the next target
// serves; one whose variable is set is ranked as usual.
func TestATargetWithoutItsKeyIsExcluded(t *testing.T) {
	t.Setenv("MOLLY_TEST_RANK_KEY_SET", "sk-set")
	t.Setenv("MOLLY_TEST_RANK_KEY_EMPTY", "")
	for _, c := range []struct {
		env     string
		missing bool
	}{{"MOLLY_TEST_RANK_KEY_SET", false}, {"MOLLY_TEST_RANK_KEY_EMPTY", true}, {"MOLLY_TEST_RANK_KEY_NEVER_SET", true}} {
		t.Run(c.env, func(t *testing.T) {
			ts := rankTargets()
			ts[2].APIKeyEnv = c.env
			cat := newCatalogue(t, ts...)
			a := annotate(t, nil, rankRequest())
			cands, excluded, _ := cat.Rank(a, decision(t, a, allow(allTiers, nil)), DefaultWeights)
			want, wantExcluded := []ranked{rCloud, rLAN, rLocal}, []Exclusion(nil)
			var missing []*Target
			if c.missing {
				want = []ranked{rLAN, rLocal}
				wantExcluded = []Exclusion{{"cloud", "no API key: api_key_env " + c.env + " is not set", ExcludedKey, ""}}
				missing = []*Target{ts[2]}
			}
			if got := rankedOf(cands); !sameRanked(got, want) || !reflect.DeepEqual(excluded, wantExcluded) {
				t.Fatalf("Rank = %v, %v; want %v, %v", got, excluded, want, wantExcluded)
			}
			if got := cat.MissingKeys(); !reflect.DeepEqual(got, missing) || (ts[2].MissingKey() != "") != c.missing {
				t.Fatalf("MissingKeys = %v, MissingKey %q", got, ts[2].MissingKey())
			}
		})
	}
	t.Run("the request's own reasons come first", func(t *testing.T) {
		ts := rankTargets()
		ts[2].APIKeyEnv, ts[2].MaxContext = "MOLLY_TEST_RANK_KEY_NEVER_SET", 1000
		cat := newCatalogue(t, ts...)
		a := annotate(t, nil, rankRequest())
		_, excluded, _ := cat.Rank(a, decision(t, a, allow(allTiers, nil)), DefaultWeights)
		if len(excluded) != 1 || excluded[0].Kind != ExcludedContext {
			t.Fatalf("excluded %v, want cloud for its context window", excluded)
		}
	})
}

func TestRankUnknownModel(t *testing.T) {
	c := newCatalogue(t, rankTargets()...)
	r := rankRequest()
	r.model = "nobody-serves-this"
	a := annotate(t, nil, r)
	cands, excluded, known := c.Rank(a, decision(t, a, allow(allTiers, nil)), DefaultWeights)
	if known || cands != nil || excluded != nil {
		t.Fatalf("Rank = %v, %v, %v; want nothing and known = false", cands, excluded, known)
	}
	r.model = "big" // served by lan only, which the decision excludes
	a = annotate(t, nil, r)
	cands, excluded, known = c.Rank(a, decision(t, a, allow([]string{"T0"}, nil)), DefaultWeights)
	if !known || len(cands) != 0 || !reflect.DeepEqual(excluded, []Exclusion{{"lan", "tier T1 not allowed by the policy", ExcludedPolicy, ""}}) {
		t.Fatalf("Rank = %v, %v, %v; want lan excluded and known = true", cands, excluded, known)
	}
}

func TestRankWithOverrides(t *testing.T) {
	tests := []struct {
		name     string
		decision map[string]any
		o        Overrides
		want     []ranked
		excluded []Exclusion
	}{
		{"X-Molly-Max-Cost below the cloud's expected cost excludes it",
			allow(allTiers, nil), Overrides{MaxCostUSD: 0.005, HasMaxCost: true},
			[]ranked{rLAN, rLocal}, []Exclusion{{"cloud", "expected cost 0.0125 USD over X-Molly-Max-Cost 0.005", ExcludedCost, ""}}},
		{"X-Molly-Max-Cost 0 keeps the free targets only",
			allow(allTiers, nil), Overrides{HasMaxCost: true},
			[]ranked{rLocal}, []Exclusion{{"lan", "expected cost 0.002 USD over X-Molly-Max-Cost 0", ExcludedCost, ""}, {"cloud", "expected cost 0.0125 USD over X-Molly-Max-Cost 0", ExcludedCost, ""}}},
		{"the policy's max_cost_usd is checked before the header's",
			allow(allTiers, map[string]any{"max_cost_usd": 0.001}), Overrides{MaxCostUSD: 1, HasMaxCost: true},
			[]ranked{rLocal}, []Exclusion{{"lan", "expected cost 0.002 USD over the policy limit 0.001", ExcludedPolicy, ""}, {"cloud", "expected cost 0.0125 USD over the policy limit 0.001", ExcludedPolicy, ""}}},
		{"prefer best orders by quality alone",
			allow(allTiers, nil), Overrides{Prefer: PreferBest},
			[]ranked{withScore(rCloud, 0.9), withScore(rLAN, 0.7), withScore(rLocal, 0.6)}, nil},
		{"prefer cheap weighs a dollar 100 quality points: the free target wins",
			allow(allTiers, nil), Overrides{Prefer: PreferCheap},
			[]ranked{withScore(rLocal, 0.6-0.05*2), withScore(rLAN, 0.7-100*0.002-0.05*1), withScore(rCloud, 0.9-100*0.0125-0.05*0.5)}, nil},
		{"prefer local costs remote tiers 0.1 per step from T0",
			allow(allTiers, nil), Overrides{Prefer: PreferLocal},
			[]ranked{withScore(rLAN, 0.63-0.1), withScore(rLocal, 0.5), withScore(rCloud, 0.75-0.3)}, nil},
		{"prefer local does not lift a tier the policy excluded",
			allow([]string{"T3"}, nil), Overrides{Prefer: PreferLocal},
			[]ranked{withScore(rCloud, 0.75-0.3)}, []Exclusion{{"local", "tier T0 not allowed by the policy", ExcludedPolicy, ""}, {"lan", "tier T1 not allowed by the policy", ExcludedPolicy, ""}}},
	}
	a := annotate(t, nil, rankRequest())
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := newCatalogue(t, rankTargets()...)
			cands, excluded, known := c.RankWith(a, decision(t, a, tt.decision), Selection{Weights: DefaultWeights, Overrides: tt.o})
			if !known {
				t.Fatal("known = false for a served model")
			}
			if got := rankedOf(cands); !sameRanked(got, tt.want) {
				t.Errorf("candidates =\n%v\nwant\n%v", got, tt.want)
			}
			if !reflect.DeepEqual(excluded, tt.excluded) {
				t.Errorf("excluded = %q\nwant       %q", excluded, tt.excluded)
			}
		})
	}
}

func TestParseOverrides(t *testing.T) {
	tests := []struct {
		name    string
		headers map[string]string
		want    Overrides
		param   string // of the 400; "" for none
	}{
		{"no headers: no overrides", nil, Overrides{}, ""},
		{"a max cost in USD", map[string]string{"X-Molly-Max-Cost": " 0.002 "}, Overrides{MaxCostUSD: 0.002, HasMaxCost: true}, ""},
		{"a zero max cost is a cap, not its absence", map[string]string{"X-Molly-Max-Cost": "0"}, Overrides{HasMaxCost: true}, ""},
		{"prefer is case-insensitive", map[string]string{"X-Molly-Prefer": "Local"}, Overrides{Prefer: PreferLocal}, ""},
		{"both together", map[string]string{"X-Molly-Prefer": "cheap", "X-Molly-Max-Cost": "1e-3"}, Overrides{MaxCostUSD: 0.001, HasMaxCost: true, Prefer: PreferCheap}, ""},
		{"a negative max cost is refused", map[string]string{"X-Molly-Max-Cost": "-1"}, Overrides{}, "X-Molly-Max-Cost"},
		{"a max cost that is no number is refused", map[string]string{"X-Molly-Max-Cost": "cheap"}, Overrides{}, "X-Molly-Max-Cost"},
		{"NaN is refused", map[string]string{"X-Molly-Max-Cost": "NaN"}, Overrides{}, "X-Molly-Max-Cost"},
		{"an absurd max cost is refused", map[string]string{"X-Molly-Max-Cost": "1e12"}, Overrides{}, "X-Molly-Max-Cost"},
		{"an unknown preference is refused", map[string]string{"X-Molly-Prefer": "fast"}, Overrides{}, "X-Molly-Prefer"},
		{"a trace consent of any case is read by the capture", map[string]string{"X-Molly-Trace": "ON"}, Overrides{}, ""},
		{"a trace consent other than on or off is refused", map[string]string{"X-Molly-Trace": "maybe"}, Overrides{}, "X-Molly-Trace"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := http.Header{}
			for k, v := range tt.headers {
				h.Set(k, v)
			}
			got, err := ParseOverrides(h)
			if tt.param != "" {
				if err == nil || err.Status != 400 || err.Param != tt.param {
					t.Fatalf("err = %v, want a 400 about %s", err, tt.param)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("ParseOverrides = %+v, %v; want %+v", got, err, tt.want)
			}
		})
	}
}

// budgetTargets are lan (free, quality 0.5), remote (0.1 USD per 1M
// tokens, 0.6) and cloud (1 USD, 0.9) serving "m". A request of 14 prompt
// tokens and the DefaultCompletionTokens (256) is expected to cost remote
// 270·0.1/1e6 = 0.000027 and cloud 270/1e6 = 0.000270 USD; its worst case,
// the prompt at its bound B, (B+256)·0.1/1e6 and (B+256)/1e6.
func budgetTargets() []*Target {
	return []*Target{
		{Name: "lan", Tier: "T1", Endpoint: "http://127.0.0.1:1/v1", Models: []string{"m"}, Quality: map[string]float64{"default": 0.5}},
		{Name: "remote", Tier: "T2", Endpoint: "http://127.0.0.1:2/v1", Models: []string{"m"}, Quality: map[string]float64{"default": 0.6}, PriceIn: 0.1, PriceOut: 0.1},
		{Name: "cloud", Tier: "T3", Endpoint: "http://127.0.0.1:3/v1", Models: []string{"m"}, Quality: map[string]float64{"default": 0.9}, PriceIn: 1, PriceOut: 1},
	}
}

func TestSelectionHonoursTheRemainingBudget(t *testing.T) {
	cat := newCatalogue(t, budgetTargets()...)
	a := annotate(t, nil, request{text: "what is the capital of France?", promptTokens: 14})
	// The worst cases by hand: the prompt's bound and 256 completion tokens.
	bound := float64(a.PromptBound())
	if bound <= 14 {
		t.Fatalf("the prompt's bound %v is not above its estimate", bound)
	}
	remoteWorst, cloudWorst := (bound+256)*0.1/1e6, (bound+256)*1/1e6
	over := func(target string, worst, remaining float64) Exclusion {
		return Exclusion{target, fmt.Sprintf("worst-case cost %.6f USD over the remaining budget %.6f", worst, remaining), ExcludedBudget, ""}
	}
	// Between remote's expected cost (0.000027) and its worst case: remote
	// would have been kept on its expected cost, and its reservation refused.
	between := (0.000027 + remoteWorst) / 2
	cases := []struct {
		name         string
		tiers        []string
		budgeted     bool
		remaining    float64
		wantCands    []string
		wantExcluded []Exclusion
	}{
		{"without a budget every allowed candidate stays", []string{"T1", "T2", "T3"}, false, 0, []string{"cloud", "remote", "lan"}, nil},
		{"a budget under cloud's worst case excludes cloud", []string{"T1", "T2", "T3"}, true, 0.0001, []string{"remote", "lan"},
			[]Exclusion{over("cloud", cloudWorst, 0.0001)}},
		{"a budget under every paid candidate leaves the free one", []string{"T1", "T2", "T3"}, true, 0.00001, []string{"lan"},
			[]Exclusion{over("remote", remoteWorst, 0.00001), over("cloud", cloudWorst, 0.00001)}},
		{"a budget above remote's expected cost but under its worst case leaves the free one", []string{"T1", "T2", "T3"}, true, between, []string{"lan"},
			[]Exclusion{over("remote", remoteWorst, between), over("cloud", cloudWorst, between)}},
		{"a budget no candidate fits keeps them all, for the ledger to refuse", []string{"T2", "T3"}, true, 0.00001, []string{"cloud", "remote"},
			[]Exclusion{{"lan", "tier T1 not allowed by the policy", ExcludedPolicy, ""}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			d := decision(t, a, allow(tc.tiers, nil))
			sel := Selection{Weights: DefaultWeights, Budgeted: tc.budgeted, RemainingUSD: tc.remaining}
			cands, excluded, _ := cat.RankWith(a, d, sel)
			var names []string
			for _, c := range cands {
				names = append(names, c.Target.Name)
			}
			if !slices.Equal(names, tc.wantCands) {
				t.Errorf("candidates %v, want %v", names, tc.wantCands)
			}
			if !reflect.DeepEqual(excluded, tc.wantExcluded) {
				t.Errorf("exclusions %q, want %q", excluded, tc.wantExcluded)
			}
			// Whenever a candidate fits, the plan's reservation fits too, so the
			// ledger does not refuse a request the kept candidates can serve.
			if p := cat.NewPlan(a, d, sel, Config{}); tc.budgeted && len(tc.wantExcluded) > 0 && tc.wantExcluded[0].Kind == ExcludedBudget && p.Reserve.CostUSD > tc.remaining {
				t.Errorf("the plan reserves %v USD, over the remaining %v", p.Reserve.CostUSD, tc.remaining)
			}
		})
	}
}

func TestLearnedPriorsChangeLaterDecisions(t *testing.T) {
	cloudChat := PriorKey{"cloud", "gpt-m", "chat"}
	plain := annotate(t, nil, rankRequest())
	d := decision(t, plain, allow(allTiers, nil))
	stream := rankRequest()
	stream.stream = true
	streamed := annotate(t, nil, stream)
	rank := func(p *Priors, a *classify.Annotation) []ranked {
		c := newCatalogue(t, rankTargets()...)
		cands, _, _ := c.RankWith(a, d, Selection{Weights: DefaultWeights, Priors: p})
		return rankedOf(cands)
	}
	t.Run("without observations the configured seeds rank", func(t *testing.T) {
		if got := rank(NewPriors(), plain); !sameRanked(got, []ranked{rCloud, rLAN, rLocal}) {
			t.Fatalf("got %v", got)
		}
	})
	t.Run("one bad score moves the cloud's prior by α but it stays first", func(t *testing.T) {
		p := NewPriors()
		if q, err := p.ObserveQuality(cloudChat, 0.9, 0); err != nil || math.Abs(q-0.81) > 1e-12 {
			t.Fatalf("ObserveQuality = %v, %v; want 0.81", q, err)
		}
		want := []ranked{{"cloud", "gpt-m", 0.81, 0.0125, 0.5, 0.81 - 0.125 - 0.025}, rLAN, rLocal}
		if got := rank(p, plain); !sameRanked(got, want) {
			t.Fatalf("got %v\nwant %v", got, want)
		}
	})
	t.Run("two bad scores put lan first", func(t *testing.T) {
		p := NewPriors()
		p.ObserveQuality(cloudChat, 0.9, 0)
		p.ObserveQuality(cloudChat, 0.9, 0) // 0.9 · 0.9 · 0.9 = 0.729
		want := []ranked{rLAN, {"cloud", "gpt-m", 0.729, 0.0125, 0.5, 0.729 - 0.125 - 0.025}, rLocal}
		if got := rank(p, plain); !sameRanked(got, want) {
			t.Fatalf("got %v\nwant %v", got, want)
		}
	})
	t.Run("a prior is per category: coding keeps its seed", func(t *testing.T) {
		p := NewPriors()
		p.ObserveQuality(cloudChat, 0.9, 0)
		if q, n := p.Quality(PriorKey{"cloud", "gpt-m", "coding"}, 0.9); q != 0.9 || n != 0 {
			t.Fatalf("coding prior = %v (%d), want the seed 0.9", q, n)
		}
	})
	t.Run("an observed latency replaces the static prior: total for a whole answer, first byte for a stream", func(t *testing.T) {
		p := NewPriors()
		p.ObserveLatency("local", 100*time.Millisecond, 200*time.Millisecond)
		if got := rank(p, plain); !sameRanked(got, []ranked{rCloud, rLAN, {"local", "local-m", 0.6, 0, 0.2, 0.6 - 0.05*0.2}}) {
			t.Fatalf("whole answer: got %v", got)
		}
		if got := rank(p, streamed); !sameRanked(got, []ranked{rCloud, rLAN, {"local", "local-m", 0.6, 0, 0.1, 0.6 - 0.05*0.1}}) {
			t.Fatalf("stream: got %v", got)
		}
		p.ObserveLatency("local", 300*time.Millisecond, 400*time.Millisecond)
		if l, ok := p.Latency("local", false); !ok || math.Abs(l-(0.7*0.2+0.3*0.4)) > 1e-12 {
			t.Fatalf("total latency EWMA = %v, want 0.26", l)
		}
	})
}

func TestAdapterVariantCandidates(t *testing.T) {
	eng := demoEngine(t)
	cat, err := NewCatalogue([]*Target{
		{Name: "device", Tier: "T0", Kind: KindEngine, Models: []string{"chat=molly-demo"}, LatencyMS: 50,
			Quality: map[string]float64{"default": 0.3, "billing": 0.9}},
		{Name: "lan", Tier: "T1", Endpoint: "http://127.0.0.1:1/v1", Models: []string{"chat"}, LatencyMS: 1000,
			Quality: map[string]float64{"default": 0.7}},
	}, eng)
	if err != nil {
		t.Fatal(err)
	}
	cls := testClassifier(t, classify.WithDomains(cat.Domains))
	ask := func(t *testing.T, model, text, task string) *classify.Annotation {
		t.Helper()
		a := annotate(t, cls, request{model: model, maxTokens: 500, text: text})
		if a.Task() != task {
			t.Fatalf("%q is task %q, want %s", text, a.Task(), task)
		}
		return a
	}
	const billing, coding = "I was charged twice on my invoice, please refund ", "why does this python function raise an exception "
	d := decision(t, ask(t, "chat", billing, "billing"), allow([]string{"T0", "T1"}, nil))
	base := ranked{"device", "molly-demo", 0.3, 0, 0.05, 0.3 - 0.05*0.05}
	lan := ranked{"lan", "chat", 0.7, 0, 1, 0.7 - 0.05}
	tests := []struct {
		name, model, text, task string
		want                    []ranked
	}{
		{"a billing task on a generic name adds the billing adapter, which outranks the unadapted T1 target", "chat", billing, "billing",
			[]ranked{{"device", "molly-demo:billing", 0.9, 0, 0.05, 0.9 - 0.05*0.05}, lan, base}},
		{"a task no adapter is named for adds nothing", "chat", coding, "coding", []ranked{lan, base}},
		{"a client that named the base model directly gets the adapter too", "molly-demo", billing, "billing",
			[]ranked{{"device", "molly-demo:billing", 0.9, 0, 0.05, 0.9 - 0.05*0.05}, base}},
		{"a client that named another adapter keeps it, with the target's default prior", "molly-demo:legal", billing, "billing",
			[]ranked{{"device", "molly-demo:legal", 0.3, 0, 0.05, 0.3 - 0.05*0.05}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cands, _, _ := cat.RankWith(ask(t, tt.model, tt.text, tt.task), d, Selection{Weights: DefaultWeights})
			if got := rankedOf(cands); !sameRanked(got, tt.want) {
				t.Fatalf("got %v\nwant %v", got, tt.want)
			}
		})
	}
	t.Run("bad feedback on the adapter lets the T1 target win", func(t *testing.T) {
		p := NewPriors()
		key := PriorKey{"device", "molly-demo:billing", "billing"}
		for range 3 {
			p.ObserveQuality(key, 0.9, 0) // 0.9 · 0.9³ = 0.6561
		}
		a := ask(t, "chat", billing, "billing")
		cands, _, _ := cat.RankWith(a, d, Selection{Weights: DefaultWeights, Priors: p})
		want := []ranked{{"device", "molly-demo:billing", 0.6561, 0, 0.05, 0.6561 - 0.0025}, lan, base}
		if got := rankedOf(cands); !sameRanked(got, want) {
			t.Fatalf("after 3 scores of 0: got %v\nwant %v", got, want)
		}
		p.ObserveQuality(key, 0.9, 0) // 0.59049
		cands, _, _ = cat.RankWith(a, d, Selection{Weights: DefaultWeights, Priors: p})
		want = []ranked{lan, {"device", "molly-demo:billing", 0.59049, 0, 0.05, 0.59049 - 0.0025}, base}
		if got := rankedOf(cands); !sameRanked(got, want) {
			t.Fatalf("after 4: got %v\nwant %v", got, want)
		}
		if cands[1].Adapter() != "billing" || cands[0].Adapter() != "" || cands[2].Adapter() != "" || cands[1].Learned != 4 {
			t.Fatalf("adapters %q, %q, %q; learned %d", cands[0].Adapter(), cands[1].Adapter(), cands[2].Adapter(), cands[1].Learned)
		}
	})
	t.Run("the catalogue's domains are the engine's adapter names", func(t *testing.T) {
		if got := cat.Domains(); !reflect.DeepEqual(got, []string{"billing", "legal", "payments", "support"}) {
			t.Fatalf("Domains = %q", got)
		}
		var none *Catalogue
		if none.Domains() != nil {
			t.Fatal("a nil catalogue has domains")
		}
	})
	t.Run("an engine target takes the engine's context window", func(t *testing.T) {
		if got := cat.Targets()[0].MaxContext; got != eng.ContextTokens() || got <= 0 {
			t.Fatalf("MaxContext = %d, engine context %d", got, eng.ContextTokens())
		}
	})
}

func TestRouteHeader(t *testing.T) {
	c := newCatalogue(t, rankTargets()...)
	a := annotate(t, nil, rankRequest())
	cands, _, _ := c.Rank(a, decision(t, a, allow(allTiers, nil)), DefaultWeights)
	tests := []struct {
		name     string
		chosen   Candidate
		cands    []Candidate
		excluded []Exclusion
		want     string
	}{
		{"the first choice names the runner-up", cands[0], cands, nil, "cloud/gpt-m score=0.7500; runner-up lan/m score=0.6300"},
		{"a fallback says so and names the best other candidate", cands[1], cands, nil, "lan/m score=0.6300; runner-up cloud/gpt-m score=0.7500; fallback"},
		{"a lone candidate has no runner-up", cands[2], cands[2:], nil, "local/local-m score=0.5000; runner-up none"},
		{"excluded targets end the header with their reasons", cands[1], cands[1:], []Exclusion{{"cloud", "tier T3 not allowed by the policy", ExcludedPolicy, ""}, {"eu", `region "EU" outside the allowed regions local`, ExcludedPolicy, ""}},
			`lan/m score=0.6300; runner-up local/local-m score=0.5000; excluded cloud: tier T3 not allowed by the policy; excluded eu: region "EU" outside the allowed regions local`},
		{"a reason outside printable ASCII is made safe for a header", cands[2], cands[2:], []Exclusion{{Target: "x", Reason: "région\r\nX-Evil: 1"}},
			"local/local-m score=0.5000; runner-up none; excluded x: r?gion??X-Evil: 1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := RouteHeader(tt.chosen, tt.cands, tt.excluded); got != tt.want {
				t.Fatalf("RouteHeader = %q, want %q", got, tt.want)
			}
		})
	}
}

func TestDescribe(t *testing.T) {
	tg := &Target{Name: "lan"}
	if got, want := Describe(Candidate{Target: tg, Model: "m", Quality: 0.7, CostUSD: 0.002, LatencyS: 1, Score: 0.63}),
		"lan/m q=0.7000 (config) cost=0.002000 lat=1.000 score=0.6300"; got != want {
		t.Fatalf("Describe = %q, want %q", got, want)
	}
	if got, want := Describe(Candidate{Target: tg, Model: "m", Quality: 0.65, Learned: 3}),
		"lan/m q=0.6500 (learned 3) cost=0.000000 lat=0.000 score=0.0000"; got != want {
		t.Fatalf("Describe = %q, want %q", got, want)
	}
	if !strings.HasPrefix(Exclusion{Target: "a", Reason: "b"}.String(), "a: b") {
		t.Fatal("Exclusion.String")
	}
}

// EngineModel names the engine's model for a client model only the engine
// serves: not for one a LAN target serves too, nor for one nobody serves.
func TestEngineModelIsForModelsOnlyTheEngineServes(t *testing.T) {
	eng := demoEngine(t)
	cat, err := NewCatalogue([]*Target{
		{Name: "device", Tier: "T0", Kind: KindEngine, Models: []string{"chat=molly-demo", "shared=molly-demo"}},
		{Name: "lan", Tier: "T1", Endpoint: "http://127.0.0.1:1/v1", Models: []string{"shared", "remote"}},
	}, eng)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		model, want string
		ok          bool
	}{
		{"chat", "molly-demo", true},
		{"molly-demo", "molly-demo", true}, // the engine's own name
		{"shared", "", false},
		{"remote", "", false},
		{"nobody", "", false},
	} {
		if got, ok := cat.EngineModel(c.model); got != c.want || ok != c.ok {
			t.Errorf("EngineModel(%q) = %q, %v; want %q, %v", c.model, got, ok, c.want, c.ok)
		}
	}
}
