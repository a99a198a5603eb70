package router

import (
	"math"
	"reflect"
	"testing"
)

// rankTargets are three alternatives for model "m" with known score terms
// for a request of 1000 prompt and 500 completion tokens (task chat):
//
//	local: q 0.6, cost 0,                         latency 2 s   → 0.6 − 0      − 0.1   = 0.5
//	lan:   q 0.7, cost (1000·1+500·2)/1e6 = 0.002,  latency 1 s → 0.7 − 0.02   − 0.05  = 0.63
//	cloud: q 0.9, cost (1000·5+500·15)/1e6 = 0.0125, latency 0.5 s → 0.9 − 0.125 − 0.025 = 0.75
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

func rankRequest() *Annotation {
	return &Annotation{Capability: Capability{Endpoint: EndpointChat, Model: "m", PromptTokens: 1000, MaxTokens: 500,
		Modalities: []string{"text"}, Task: "chat"}}
}

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

func TestRank(t *testing.T) {
	all := []string{"T0", "T1", "T2", "T3"}
	tests := []struct {
		name     string
		decision map[string]any
		edit     func(a *Annotation, ts []*Target)
		weights  Weights
		want     []ranked
		excluded []Exclusion
	}{
		{"every tier allowed: the objective orders cloud, lan, local",
			decisionMap(all, nil), nil, DefaultWeights,
			[]ranked{rCloud, rLAN, rLocal}, nil},
		{"a tier the policy does not allow is excluded",
			decisionMap([]string{"T0", "T1", "T2"}, nil), nil, DefaultWeights,
			[]ranked{rLAN, rLocal}, []Exclusion{{"cloud", "tier T3 not allowed by the policy"}}},
		{"a denial excludes every target",
			map[string]any{"allow": false, "tiers": []any{"T0"}, "reasons": []any{"no"}}, nil, DefaultWeights,
			nil, []Exclusion{{"local", "tier T0 not allowed by the policy"}, {"lan", "tier T1 not allowed by the policy"}, {"cloud", "tier T3 not allowed by the policy"}}},
		{"a region outside the decision's regions is excluded",
			decisionMap(all, map[string]any{"regions": []any{"EU", "local"}}), nil, DefaultWeights,
			[]ranked{rLAN, rLocal}, []Exclusion{{"cloud", `region "US" outside the allowed regions EU,local`}}},
		{"a target in the decision's region stays",
			decisionMap(all, map[string]any{"regions": []any{"US"}}), nil, DefaultWeights,
			[]ranked{rCloud}, []Exclusion{{"local", `region "local" outside the allowed regions US`}, {"lan", `region "local" outside the allowed regions US`}}},
		{"a target without the request's modality is excluded",
			decisionMap(all, nil), func(a *Annotation, ts []*Target) {
				a.Modalities = []string{"text", "image"}
				ts[2].Modalities = []string{"text", "image"}
			}, DefaultWeights,
			[]ranked{rCloud}, []Exclusion{{"local", "accepts text, request needs text,image"}, {"lan", "accepts text, request needs text,image"}}},
		{"a context window smaller than prompt plus completion is excluded",
			decisionMap(all, nil), func(a *Annotation, ts []*Target) { ts[2].MaxContext = 1499; ts[1].MaxContext = 1500 }, DefaultWeights,
			[]ranked{rLAN, rLocal}, []Exclusion{{"cloud", "context window 1499 tokens < 1500 needed"}}},
		{"an expected cost over max_cost_usd is excluded",
			decisionMap(all, map[string]any{"max_cost_usd": 0.005}), nil, DefaultWeights,
			[]ranked{rLAN, rLocal}, []Exclusion{{"cloud", "expected cost 0.012500 USD over the policy limit 0.005000"}}},
		{"a cost equal to max_cost_usd is allowed",
			decisionMap(all, map[string]any{"max_cost_usd": 0.0125}), nil, DefaultWeights,
			[]ranked{rCloud, rLAN, rLocal}, nil},
		{"a heavy cost weight prefers the free target",
			decisionMap(all, nil), nil, Weights{Cost: 100, Latency: 0.05},
			[]ranked{rLocal, withScore(rLAN, 0.7-0.2-0.05), withScore(rCloud, 0.9-1.25-0.025)}, nil},
		{"zero weights order by quality alone",
			decisionMap(all, nil), nil, Weights{},
			[]ranked{withScore(rCloud, 0.9), withScore(rLAN, 0.7), withScore(rLocal, 0.6)}, nil},
		{"without max_tokens the cost assumes DefaultCompletionTokens",
			decisionMap(all, nil), func(a *Annotation, ts []*Target) { a.MaxTokens = 0 }, Weights{Cost: 10},
			[]ranked{
				{"cloud", "gpt-m", 0.9, (1000*5 + 256*15) / 1e6, 0.5, 0.9 - 10*(1000*5+256*15)/1e6},
				{"lan", "m", 0.7, (1000*1 + 256*2) / 1e6, 1, 0.7 - 10*(1000*1+256*2)/1e6},
				{"local", "local-m", 0.6, 0, 2, 0.6},
			}, nil},
		{"embeddings cost the prompt only",
			decisionMap(all, nil), func(a *Annotation, ts []*Target) {
				a.Endpoint = EndpointEmbeddings
				a.MaxTokens = 0
				a.Task = "embedding"
			}, Weights{Cost: 10},
			[]ranked{{"cloud", "gpt-m", 0.9, 0.005, 0.5, 0.85}, {"local", "local-m", 0.6, 0, 2, 0.6}, {"lan", "m", 0.1, 0.001, 1, 0.09}}, nil},
		{"a task without its own prior uses default, then 0.5",
			decisionMap(all, nil), func(a *Annotation, ts []*Target) { a.Task = "math"; ts[2].Quality = nil }, Weights{},
			[]ranked{withScore(ranked{"local", "local-m", 0.6, 0, 2, 0}, 0.6), withScore(ranked{"cloud", "gpt-m", 0.5, 0.0125, 0.5, 0}, 0.5), withScore(ranked{"lan", "m", 0.1, 0.002, 1, 0}, 0.1)}, nil},
		{"ties go to the more local tier whatever the declaration order",
			decisionMap(all, nil), func(a *Annotation, ts []*Target) {
				for _, t := range ts {
					t.Quality, t.PriceIn, t.PriceOut, t.LatencyMS = map[string]float64{"default": 0.8}, 0, 0, 0
				}
				ts[0], ts[2] = ts[2], ts[0]
			}, DefaultWeights,
			[]ranked{{"local", "local-m", 0.8, 0, 0, 0.8}, {"lan", "m", 0.8, 0, 0, 0.8}, {"cloud", "gpt-m", 0.8, 0, 0, 0.8}}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a, ts := rankRequest(), rankTargets()
			if tt.edit != nil {
				tt.edit(a, ts)
			}
			c := newCatalogue(t, ts...)
			cands, excluded, known := c.Rank(a, decisionOf(t, tt.decision), tt.weights)
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

func withScore(r ranked, s float64) ranked { r.Score = s; return r }

func decisionMap(tiers []string, extra map[string]any) map[string]any {
	ts := make([]any, len(tiers))
	for i, t := range tiers {
		ts[i] = t
	}
	m := map[string]any{"allow": true, "tiers": ts, "redact": map[string]any{}, "reasons": []any{"test"}}
	for k, v := range extra {
		m[k] = v
	}
	return m
}

func TestRankUnknownModel(t *testing.T) {
	c := newCatalogue(t, rankTargets()...)
	a := rankRequest()
	a.Model = "nobody-serves-this"
	cands, excluded, known := c.Rank(a, allowTiers(t, []string{"T0", "T1", "T2", "T3"}, nil), DefaultWeights)
	if known || cands != nil || excluded != nil {
		t.Fatalf("Rank = %v, %v, %v; want nothing and known = false", cands, excluded, known)
	}
	a.Model = "big" // served by lan only, which the decision excludes
	cands, excluded, known = c.Rank(a, allowTiers(t, []string{"T0"}, nil), DefaultWeights)
	if !known || len(cands) != 0 || !reflect.DeepEqual(excluded, []Exclusion{{"lan", "tier T1 not allowed by the policy"}}) {
		t.Fatalf("Rank = %v, %v, %v; want lan excluded and known = true", cands, excluded, known)
	}
}

func TestCatalogueModels(t *testing.T) {
	tests := []struct {
		name     string
		decision map[string]any
		want     []string
	}{
		{"every tier: sorted and de-duplicated client names", decisionMap([]string{"T0", "T1", "T2", "T3"}, nil), []string{"big", "gpt", "m", "small"}},
		{"only the allowed tiers' models", decisionMap([]string{"T0", "T1"}, nil), []string{"big", "m", "small"}},
		{"only on-device", decisionMap([]string{"T0"}, nil), []string{"m", "small"}},
		{"regions filter too", decisionMap([]string{"T0", "T1", "T2", "T3"}, map[string]any{"regions": []any{"US"}}), []string{"gpt", "m"}},
		{"a denial lists nothing", map[string]any{"allow": false, "tiers": []any{"T0"}}, nil},
	}
	c := newCatalogue(t, rankTargets()...)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := c.Models(decisionOf(t, tt.decision)); !reflect.DeepEqual(got, tt.want) {
				t.Fatalf("Models = %q, want %q", got, tt.want)
			}
		})
	}
}

func TestTargetValidate(t *testing.T) {
	ok := func() Target {
		return Target{Name: "a", Tier: "T1", Endpoint: "http://10.0.0.5:8000/v1", Models: []string{"m"}}
	}
	tests := []struct {
		name string
		edit func(*Target)
		want string
	}{
		{"a good target is valid", func(*Target) {}, ""},
		{"an engine target on T0 is valid", func(t *Target) { t.Kind, t.Tier, t.Endpoint = KindEngine, "T0", "" }, ""},
		{"a missing name", func(t *Target) { t.Name = "" }, "target: name is required"},
		{"an unknown tier", func(t *Target) { t.Tier = "T4" }, `target a: tier "T4" must be one of T0, T1, T2, T3`},
		{"a lower-case tier", func(t *Target) { t.Tier = "t1" }, `target a: tier "t1" must be one of T0, T1, T2, T3`},
		{"an endpoint without scheme", func(t *Target) { t.Endpoint = "10.0.0.5:8000" }, `target a: endpoint "10.0.0.5:8000" must be an http(s) URL such as http://127.0.0.1:8000/v1`},
		{"an ftp endpoint", func(t *Target) { t.Endpoint = "ftp://x/v1" }, `target a: endpoint "ftp://x/v1" must be an http(s) URL such as http://127.0.0.1:8000/v1`},
		{"an engine off T0", func(t *Target) { t.Kind = KindEngine }, "target a: kind engine runs on this machine, so its tier must be T0, not T1"},
		{"an unknown kind", func(t *Target) { t.Kind = "grpc" }, `target a: kind "grpc" must be openai or engine`},
		{"no models", func(t *Target) { t.Models = nil }, "target a: models must list at least one model name"},
		{"an alias without upstream", func(t *Target) { t.Models = []string{"m="} }, `target a: model "m=" must be name or name=upstream`},
		{"an alias without name", func(t *Target) { t.Models = []string{"=up"} }, `target a: model "=up" must be name or name=upstream`},
		{"a model with a space", func(t *Target) { t.Models = []string{"my model"} }, `target a: model "my model" must be name or name=upstream`},
		{"a quality above 1", func(t *Target) { t.Quality = map[string]float64{"chat": 1.5} }, "target a: quality chat = 1.5 must be in [0,1]"},
		{"a negative price", func(t *Target) { t.PriceOut = -1 }, "target a: price_in, price_out, latency_ms, max_context and timeout_ms must not be negative"},
		{"a negative context", func(t *Target) { t.MaxContext = -1 }, "target a: price_in, price_out, latency_ms, max_context and timeout_ms must not be negative"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tg := ok()
			tt.edit(&tg)
			err := tg.Validate()
			if got := errString(err); got != tt.want {
				t.Fatalf("Validate() = %q, want %q", got, tt.want)
			}
		})
	}
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

func TestNewCatalogue(t *testing.T) {
	t.Run("a name declared twice is refused", func(t *testing.T) {
		_, err := NewCatalogue([]*Target{
			{Name: "a", Tier: "T1", Endpoint: "http://127.0.0.1:1/v1", Models: []string{"m"}},
			{Name: "a", Tier: "T2", Endpoint: "http://127.0.0.1:2/v1", Models: []string{"m"}},
		}, nil)
		if got := errString(err); got != "target a: declared twice" {
			t.Fatalf("err = %q", got)
		}
	})
	t.Run("an engine target needs an engine", func(t *testing.T) {
		_, err := NewCatalogue([]*Target{{Name: "e", Tier: "T0", Kind: KindEngine, Models: []string{"m"}}}, nil)
		if got := errString(err); got != "target e: kind engine needs the molly app's engine, and none is configured" {
			t.Fatalf("err = %q", got)
		}
	})
	t.Run("an invalid target is refused with its validation error", func(t *testing.T) {
		_, err := NewCatalogue([]*Target{{Name: "x", Tier: "T9", Endpoint: "http://h/v1", Models: []string{"m"}}}, nil)
		if got := errString(err); got != `target x: tier "T9" must be one of T0, T1, T2, T3` {
			t.Fatalf("err = %q", got)
		}
	})
	t.Run("provisioning fills defaults and keeps declaration order", func(t *testing.T) {
		t.Setenv("MOLLY_TEST_KEY", "sk-test")
		ts := []*Target{
			{Name: "lan", Tier: "T1", Endpoint: "http://127.0.0.1:1/v1/", Models: []string{"m"}},
			{Name: "remote", Tier: "T2", Endpoint: "http://127.0.0.1:2/v1", Models: []string{"m=up"}, APIKeyEnv: "MOLLY_TEST_KEY"},
			{Name: "engine", Tier: "T0", Kind: KindEngine, Models: []string{"m"}, Modalities: []string{"text", "image"}},
		}
		c, err := NewCatalogue(ts, newOpenAIHandler())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if got := c.Targets(); len(got) != 3 || got[0] != ts[0] || got[2] != ts[2] {
			t.Fatalf("Targets = %v", got)
		}
		if ts[0].Region != "local" || ts[1].Region != "" || ts[2].Region != "local" {
			t.Errorf("regions = %q, %q, %q; want local, \"\", local", ts[0].Region, ts[1].Region, ts[2].Region)
		}
		if !reflect.DeepEqual(ts[0].Modalities, []string{"text"}) || !reflect.DeepEqual(ts[2].Modalities, []string{"text", "image"}) {
			t.Errorf("modalities = %v, %v", ts[0].Modalities, ts[2].Modalities)
		}
		if ts[1].apiKey != "sk-test" || ts[0].apiKey != "" {
			t.Errorf("api keys = %q, %q", ts[0].apiKey, ts[1].apiKey)
		}
		if ts[0].base.String() != "http://127.0.0.1:1/v1" || ts[2].base.String() != "http://engine.molly.internal/v1" {
			t.Errorf("bases = %s, %s", ts[0].base, ts[2].base)
		}
		want := map[string]any{"name": "remote", "tier": "T2", "kind": "openai", "region": "", "models": []any{"m"}, "price_in": 0.0, "price_out": 0.0}
		if got := ts[1].PolicyView(); !reflect.DeepEqual(got, want) {
			t.Errorf("PolicyView = %v, want %v", got, want)
		}
	})
}

func TestPolicyInput(t *testing.T) {
	c := newCatalogue(t, rankTargets()[:1]...)
	a := classify(t, EndpointChat, `{"model":"m","stream":true,"max_tokens":9,"messages":[{"role":"user","content":"mail alice@example.com"}]}`, "confidential")
	a.Residency = "EU"
	got := PolicyInput(a, "bob", c)
	want := map[string]any{
		"request":    map[string]any{"endpoint": "chat.completions", "model": "m", "stream": true},
		"capability": map[string]any{"task": "chat", "modalities": []any{"text"}, "prompt_tokens": 12, "max_tokens": 9, "tools": false},
		"sovereignty": map[string]any{"sensitivity": "confidential", "detected": "internal", "declared": "confidential",
			"findings": map[string]any{"EMAIL": 1}, "opaque": false, "scan_failed": false, "residency": "EU"},
		"identity": map[string]any{"member": "bob", "scopes": []any{}, "models": []any{}, "tiers": []any{}, "tools": []any{}},
		"targets": []any{map[string]any{"name": "local", "tier": "T0", "kind": "openai", "region": "local",
			"models": []any{"m", "small"}, "price_in": 0.0, "price_out": 0.0}},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("PolicyInput =\n%v\nwant\n%v", got, want)
	}
	if got := PolicyInput(a, "bob", nil)["targets"]; !reflect.DeepEqual(got, []any{}) {
		t.Fatalf("targets without a catalogue = %v, want []", got)
	}
}

// The default policy, end to end with the classifier: the class decides the tiers.
func TestDefaultPolicyTiersByClass(t *testing.T) {
	e := defaultEngine(t)
	c := newCatalogue(t, rankTargets()...)
	tests := []struct {
		name, prompt string
		want         []string
		redactT3     []string
	}{
		{"public reaches every tier and redacts nothing", "hello", []string{"T0", "T1", "T2", "T3"}, []string{}},
		{"internal stops at T2", "alice@example.com", []string{"T0", "T1", "T2"}, nil},
		{"confidential stays on T0 and T1", "4111 1111 1111 1111", []string{"T0", "T1"}, nil},
		{"restricted stays on T0", "sk-proj-abcdefghijklmnopqrstuvwxyzABCDEF0123456789abcd", []string{"T0"}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := decideDefault(t, e, classify(t, EndpointChat, chatBody(tt.prompt), ""), c)
			if !d.Allowed() || !reflect.DeepEqual(d.Tiers(), tt.want) || !reflect.DeepEqual(d.Redact("T3"), tt.redactT3) {
				t.Fatalf("decision tiers %v, redact T3 %v, reasons %v; want %v, %v", d.Tiers(), d.Redact("T3"), d.Reasons(), tt.want, tt.redactT3)
			}
		})
	}
}
