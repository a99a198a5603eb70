package route

import (
	"encoding/json"
	"math"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/molly-gateway/molly/router/classify"
	"github.com/molly-gateway/molly/router/openai"
)

// planTargets serve "m" with known costs for 1000 prompt and 500
// completion tokens, ranked y, x, z by the default weights:
//
//	y: T3, q 0.9, (1000·5 + 500·15)/1e6 = 0.0125 USD → 0.9 − 0.125 = 0.775
//	x: T1, q 0.7, (1000·1 + 500·2)/1e6  = 0.002 USD  → 0.7 − 0.02  = 0.68
//	z: T0, q 0.6, free                               → 0.6
func planTargets() []*Target {
	return []*Target{
		{Name: "x", Tier: "T1", Endpoint: "http://127.0.0.1:1/v1", Models: []string{"m"}, PriceIn: 1, PriceOut: 2, Quality: map[string]float64{"default": 0.7}},
		{Name: "y", Tier: "T3", Endpoint: "http://127.0.0.1:2/v1", Models: []string{"m"}, PriceIn: 5, PriceOut: 15, Quality: map[string]float64{"default": 0.9}},
		{Name: "z", Tier: "T0", Endpoint: "http://127.0.0.1:3/v1", Models: []string{"m"}, Quality: map[string]float64{"default": 0.6}},
	}
}

// flat starts a prompt the estimator cannot place in one category.
const flat = "Summarise and translate this text "

func names(cs []Candidate) []string {
	var out []string
	for _, c := range cs {
		out = append(out, c.Target.Name)
	}
	return out
}

func near(a, b float64) bool { return math.Abs(a-b) < 1e-12 }

func TestPlan(t *testing.T) {
	cat := newCatalogue(t, planTargets()...)
	// What one answer costs at y's and x's prices (z is free), for a prompt
	// of p tokens and out completion tokens.
	y := func(p, out int) float64 { return float64(p*5+out*15) / 1e6 }
	x := func(p, out int) float64 { return float64(p*1+out*2) / 1e6 }
	tests := []struct {
		name    string
		req     request
		cfg     Config
		tiers   []string
		want    Strategy
		cands   []string
		members int
		reserve func(p int) Reservation // p: the prompt's bound (Annotation.PromptBound)
		reasons []string
	}{
		// Every plan reserves its worst case: each answer it may obtain at
		// its full completion budget, its prompt at its bound, at the
		// prices of the costliest candidates.
		{"without strategies a request goes to the best candidate, the others in order after it",
			request{maxTokens: 500}, Config{}, allTiers, StrategySingle, []string{"y", "x", "z"}, 0,
			func(p int) Reservation { return Reservation{p + 500, y(p, 500)} }, []string{"2 fallbacks in order"}},
		{"n choices reserve n completions",
			request{maxTokens: 500, n: 2}, Config{}, allTiers, StrategySingle, []string{"y", "x", "z"}, 0,
			func(p int) Reservation { return Reservation{p + 1000, y(p, 1000)} }, []string{"2 fallbacks in order"}},
		{"a lone candidate has no fallback",
			request{maxTokens: 500}, Config{}, []string{"T0"}, StrategySingle, []string{"z"}, 0,
			func(p int) Reservation { return Reservation{p + 500, 0} }, nil},
		{"no allowed candidate reserves nothing",
			request{maxTokens: 500}, Config{}, []string{"T2"}, StrategySingle, nil, 0,
			func(int) Reservation { return Reservation{} }, []string{"no allowed candidate"}},
		{"a cascade tries the cheapest first and reserves every attempt",
			request{maxTokens: 500}, Config{Cascade: &Cascade{Threshold: -1}}, allTiers, StrategyCascade, []string{"z", "x", "y"}, 0,
			func(p int) Reservation { return Reservation{2 * (p + 500), y(p, 500) + x(p, 500)} }, nil},
		{"a cascade by score with three attempts",
			request{maxTokens: 500}, Config{Cascade: &Cascade{Threshold: -1, MaxAttempts: 3, Order: OrderScore}}, allTiers, StrategyCascade, []string{"y", "x", "z"}, 0,
			func(p int) Reservation { return Reservation{3 * (p + 500), y(p, 500) + x(p, 500)} }, nil},
		// A self-check per answer: the prompt, the answer (500) and 32 for
		// the question, 8 completion tokens, at y's and x's prices.
		{"a self-checking cascade reserves the follow-ups too",
			request{maxTokens: 500}, Config{Cascade: &Cascade{Threshold: -1, SelfCheck: true}}, allTiers, StrategyCascade, []string{"z", "x", "y"}, 0,
			func(p int) Reservation {
				return Reservation{2*(p+500) + 2*(p+532+8), y(p, 500) + x(p, 500) + y(p+532, 8) + x(p+532, 8)}
			}, nil},
		{"a stream is not cascaded without hold_tokens",
			request{maxTokens: 500, stream: true}, Config{Cascade: &Cascade{Threshold: -1}}, allTiers, StrategySingle, []string{"y", "x", "z"}, 0,
			func(p int) Reservation { return Reservation{p + 500, y(p, 500)} }, []string{"2 fallbacks in order"}},
		{"a stream is cascaded with hold_tokens",
			request{maxTokens: 500, stream: true}, Config{Cascade: &Cascade{Threshold: -1, HoldTokens: 4}}, allTiers, StrategyCascade, []string{"z", "x", "y"}, 0,
			func(p int) Reservation { return Reservation{2 * (p + 500), y(p, 500) + x(p, 500)} }, nil},
		{"a mixture asks the best two at once and reserves both",
			request{maxTokens: 500, text: flat}, Config{Mixture: &Mixture{}}, allTiers, StrategyMixture, []string{"y", "x", "z"}, 2,
			func(p int) Reservation { return Reservation{2 * (p + 500), y(p, 500) + x(p, 500)} }, nil},
		{"a mixture is not made for a stream",
			request{maxTokens: 500, text: flat, stream: true}, Config{Mixture: &Mixture{}}, allTiers, StrategySingle, []string{"y", "x", "z"}, 0,
			func(p int) Reservation { return Reservation{p + 500, y(p, 500)} }, []string{"2 fallbacks in order"}},
		// Round i's prompt holds the earlier rounds' answers and results:
		// p + i·(500 + 2048) for i = 0..4, each round at y's prices.
		{"a tool conversation reserves every round with results at their bound",
			request{maxTokens: 500}, Config{Tools: true}, allTiers, StrategyTools, []string{"y", "x", "z"}, 0,
			func(p int) Reservation {
				var r Reservation
				for i := range 5 {
					pi := p + i*(500+2048)
					r.Tokens, r.CostUSD = r.Tokens+pi+500, r.CostUSD+y(pi, 500)
				}
				return r
			}, []string{"governed tools may be offered (at most 4 rounds)"}},
		{"tool rounds and result size are the operator's",
			request{maxTokens: 500}, Config{Tools: true, ToolSteps: 1, ToolResultTokens: 100}, allTiers, StrategyTools, []string{"y", "x", "z"}, 0,
			func(p int) Reservation { return Reservation{(p + 500) + (p + 600 + 500), y(p, 500) + y(p+600, 500)} },
			[]string{"governed tools may be offered (at most 1 rounds)"}},
		{"a streamed request gets no governed tools",
			request{maxTokens: 500, stream: true}, Config{Tools: true}, allTiers, StrategySingle, []string{"y", "x", "z"}, 0,
			func(p int) Reservation { return Reservation{p + 500, y(p, 500)} }, []string{"2 fallbacks in order"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := annotate(t, nil, tt.req)
			if tt.want == StrategyMixture && a.TaskEntropy() <= 0 {
				t.Fatalf("the flat prompt has entropy %v", a.TaskEntropy())
			}
			p := cat.NewPlan(a, decision(t, a, allow(tt.tiers, nil)), Selection{Weights: DefaultWeights}, tt.cfg)
			if p.Strategy != tt.want || !slices.Equal(names(p.Candidates), tt.cands) || p.Members != tt.members || !p.Known {
				t.Fatalf("plan %s %v members %d known %v; want %s %v members %d", p.Strategy, names(p.Candidates), p.Members, p.Known, tt.want, tt.cands, tt.members)
			}
			if want := tt.reserve(a.PromptBound()); p.Reserve.Tokens != want.Tokens || !near(p.Reserve.CostUSD, want.CostUSD) {
				t.Errorf("reserve %+v, want %+v (prompt bound %d)", p.Reserve, want, a.PromptBound())
			}
			if tt.reasons != nil && !slices.Equal(p.Reasons, tt.reasons) {
				t.Errorf("reasons %q, want %q", p.Reasons, tt.reasons)
			}
		})
	}
	t.Run("the reasons name the cascade and the mixture", func(t *testing.T) {
		a := annotate(t, nil, request{maxTokens: 500})
		p := cat.NewPlan(a, decision(t, a, allow(allTiers, nil)), Selection{Weights: DefaultWeights}, Config{Cascade: &Cascade{Threshold: -1, MaxAttempts: 3}})
		if !slices.Equal(p.Reasons, []string{"cascade of up to 3 answers, order cheap"}) {
			t.Errorf("cascade reasons %q", p.Reasons)
		}
		a = annotate(t, nil, request{maxTokens: 500, text: flat})
		p = cat.NewPlan(a, decision(t, a, allow(allTiers, nil)), Selection{Weights: DefaultWeights}, Config{Mixture: &Mixture{}})
		if len(p.Reasons) != 1 || !strings.HasPrefix(p.Reasons[0], "task entropy ") || !strings.HasSuffix(p.Reasons[0], " nats over 0.00: 2 members in parallel") {
			t.Errorf("mixture reasons %q", p.Reasons)
		}
	})
	t.Run("a request that declares its own tools gets no governed tools", func(t *testing.T) {
		a, err := testClassifier(t).Classify(classify.Input{Endpoint: openai.EndpointChat,
			Body: []byte(`{"model":"m","tools":[{"type":"function","function":{"name":"mine"}}],"messages":[{"role":"user","content":"hi"}]}`)})
		if err != nil {
			t.Fatal(err)
		}
		if p := cat.NewPlan(a, decision(t, a, allow(allTiers, nil)), Selection{Weights: DefaultWeights}, Config{Tools: true}); p.Strategy != StrategySingle {
			t.Fatalf("strategy %s, want single", p.Strategy)
		}
	})
	t.Run("a model nobody serves is unknown", func(t *testing.T) {
		a := annotate(t, nil, request{model: "nope"})
		if p := cat.NewPlan(a, decision(t, a, allow(allTiers, nil)), Selection{}, Config{}); p.Known || len(p.Candidates) != 0 {
			t.Fatalf("plan %+v, want unknown", p)
		}
	})
	t.Run("the model listing is answered from the catalogue", func(t *testing.T) {
		a, err := testClassifier(t).Classify(classify.Input{Endpoint: openai.EndpointModels, Path: "/v1/models"})
		if err != nil {
			t.Fatal(err)
		}
		p := cat.NewPlan(a, decision(t, a, allow(allTiers, nil)), Selection{}, Config{Tools: true})
		if p.Strategy != StrategyModels || !p.Known || p.Reserve != (Reservation{}) {
			t.Fatalf("plan %+v", p)
		}
	})
	t.Run("a plan is written as JSON with its candidates' terms", func(t *testing.T) {
		a := annotate(t, nil, request{maxTokens: 500})
		p := cat.NewPlan(a, decision(t, a, allow(allTiers, nil)), Selection{Weights: DefaultWeights}, Config{})
		b, err := json.Marshal(p)
		if err != nil {
			t.Fatal(err)
		}
		want := `{"strategy":"single","candidates":[` +
			`{"target":"y","tier":"T3","model":"m","quality":0.9,"cost_usd":0.0125,"latency_s":0,"score":0.775},` +
			`{"target":"x","tier":"T1","model":"m","quality":0.7,"cost_usd":0.002,"latency_s":0,"score":0.68},` +
			`{"target":"z","tier":"T0","model":"m","quality":0.6,"cost_usd":0,"latency_s":0,"score":0.6}],` +
			`"known":true,"reserve":{"tokens":` + strconv.Itoa(a.PromptBound()+500) + `,"cost_usd":` +
			strconv.FormatFloat(float64(a.PromptBound()*5+500*15)/1e6, 'g', -1, 64) + `},"reasons":["2 fallbacks in order"]}`
		if string(b) != want {
			t.Fatalf("plan JSON\n%s\nwant\n%s", b, want)
		}
	})
}

// TestMixtureMembers: the members are the best k whose expected costs
// together fit the budget (the caller's remaining budget, X-Molly-Max-Cost,
// the policy's max_cost_usd: the smallest); candidates whose worst case is
// over the remaining budget are excluded by the ranking before that.
func TestMixtureMembers(t *testing.T) {
	// Costs for 1000 prompt tokens: a 0.3, b 0.2, c 0.1 USD; ranked a, b, c by quality alone.
	cat := newCatalogue(t,
		&Target{Name: "a", Tier: "T1", Endpoint: "http://127.0.0.1:1/v1", Models: []string{"m"}, PriceIn: 300, Quality: map[string]float64{"default": 0.9}},
		&Target{Name: "b", Tier: "T1", Endpoint: "http://127.0.0.1:2/v1", Models: []string{"m"}, PriceIn: 200, Quality: map[string]float64{"default": 0.8}},
		&Target{Name: "c", Tier: "T1", Endpoint: "http://127.0.0.1:3/v1", Models: []string{"m"}, PriceIn: 100, Quality: map[string]float64{"default": 0.7}},
	)
	a := annotate(t, nil, request{maxTokens: 1, text: flat})
	if a.TaskEntropy() <= 0 {
		t.Fatalf("the flat prompt has entropy %v", a.TaskEntropy())
	}
	// With max_tokens 1, each completion token adds nothing at price_out 0.
	// Worst cases, the prompt at its bound B: a 300·B/1e6, b 200·B/1e6, c 100·B/1e6 USD.
	perPrice := float64(a.PromptBound()) / 1e6
	cases := []struct {
		name     string
		entropy  float64
		sel      Selection
		policy   map[string]any
		strategy Strategy
		cands    []string
		members  int
	}{
		{"without a budget the top k are the members", 0, Selection{}, nil, StrategyMixture, []string{"a", "b", "c"}, 2},
		{"a candidate whose worst case overruns the remaining budget is left out before the members are chosen", 0,
			Selection{Budgeted: true, RemainingUSD: 250 * perPrice}, nil, StrategyMixture, []string{"b", "c"}, 2},
		{"X-Molly-Max-Cost bounds the members' total below the remaining budget", 0,
			Selection{Budgeted: true, RemainingUSD: 10, Overrides: Overrides{MaxCostUSD: 0.45, HasMaxCost: true}}, nil, StrategyMixture, []string{"a", "c", "b"}, 2},
		{"the policy's max_cost_usd bounds it too", 0, Selection{}, map[string]any{"max_cost_usd": 0.45}, StrategyMixture, []string{"a", "c", "b"}, 2},
		{"a budget only one candidate fits leaves one candidate and no mixture", 0, Selection{Budgeted: true, RemainingUSD: 150 * perPrice}, nil, StrategySingle, []string{"c"}, 0},
		{"members that do not fit together mean no mixture", 0, Selection{Overrides: Overrides{MaxCostUSD: 0.35, HasMaxCost: true}}, nil, StrategySingle, []string{"a", "b", "c"}, 0},
		{"an entropy at the threshold means no mixture", a.TaskEntropy(), Selection{}, nil, StrategySingle, []string{"a", "b", "c"}, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			d := allow([]string{"T1"}, tc.policy)
			p := cat.NewPlan(a, decision(t, a, d), tc.sel, Config{Mixture: &Mixture{Entropy: tc.entropy}})
			if p.Strategy != tc.strategy || !slices.Equal(names(p.Candidates), tc.cands) || p.Members != tc.members {
				t.Fatalf("plan %s %v members %d (%q), want %s %v members %d", p.Strategy, names(p.Candidates), p.Members, p.Reasons, tc.strategy, tc.cands, tc.members)
			}
		})
	}
}

func TestCascadeSettingsAreValidated(t *testing.T) {
	cases := []struct {
		name    string
		cascade *Cascade
		wantErr string
	}{
		{"no cascade is valid", nil, ""},
		{"a negative threshold with defaults is valid", &Cascade{Threshold: -1.5}, ""},
		{"a positive threshold is refused", &Cascade{Threshold: 0.5}, "threshold 0.5"},
		{"a NaN threshold is refused", &Cascade{Threshold: math.NaN()}, "threshold NaN"},
		{"an infinite threshold is refused", &Cascade{Threshold: math.Inf(-1)}, "threshold -Inf"},
		{"negative max_attempts are refused", &Cascade{Threshold: -1, MaxAttempts: -1}, "max_attempts -1"},
		{"an unknown order is refused", &Cascade{Threshold: -1, Order: "random"}, `order "random"`},
		{"negative hold_tokens are refused", &Cascade{Threshold: -1, HoldTokens: -2}, "hold_tokens -2"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.cascade.Validate()
			if (err == nil) != (tc.wantErr == "") || (err != nil && !strings.Contains(err.Error(), tc.wantErr)) {
				t.Fatalf("Validate() = %v, want an error containing %q", err, tc.wantErr)
			}
		})
	}
	if (&Cascade{}).Attempts() != DefaultCascadeAttempts || (&Cascade{MaxAttempts: 5}).Attempts() != 5 {
		t.Fatal("Attempts does not default to DefaultCascadeAttempts")
	}
}

func TestMixtureSettingsAreValidated(t *testing.T) {
	cases := []struct {
		name    string
		mixture *Mixture
		wantErr bool
	}{
		{"no mixture is valid", nil, false},
		{"an entropy with the default k is valid", &Mixture{Entropy: 0.6}, false},
		{"a negative entropy is refused", &Mixture{Entropy: -0.1}, true},
		{"a NaN entropy is refused", &Mixture{Entropy: math.NaN()}, true},
		{"k of one is refused", &Mixture{Entropy: 0.6, K: 1}, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.mixture.Validate(); (err != nil) != tc.wantErr {
				t.Fatalf("Validate() = %v, want error: %v", err, tc.wantErr)
			}
		})
	}
}

func TestConfigBounds(t *testing.T) {
	if c := (Config{}); c.Steps() != DefaultToolSteps || c.ResultTokens() != DefaultToolResultTokens {
		t.Fatalf("defaults %d, %d", c.Steps(), c.ResultTokens())
	}
	if c := (Config{ToolSteps: 2, ToolResultTokens: 10}); c.Steps() != 2 || c.ResultTokens() != 10 {
		t.Fatalf("set %d, %d", c.Steps(), c.ResultTokens())
	}
}
