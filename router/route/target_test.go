package route

import (
	"reflect"
	"testing"
	"time"
)

func TestCatalogueModels(t *testing.T) {
	tests := []struct {
		name     string
		decision map[string]any
		want     []string
	}{
		{"every tier: sorted and de-duplicated client names", allow(allTiers, nil), []string{"big", "gpt", "m", "small"}},
		{"only the allowed tiers' models", allow([]string{"T0", "T1"}, nil), []string{"big", "m", "small"}},
		{"only on-device", allow([]string{"T0"}, nil), []string{"m", "small"}},
		{"regions filter too", allow(allTiers, map[string]any{"regions": []any{"US"}}), []string{"gpt", "m"}},
		{"a denial lists nothing", map[string]any{"allow": false, "tiers": []any{"T0"}}, nil},
	}
	c := newCatalogue(t, rankTargets()...)
	a := annotate(t, nil, rankRequest())
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := c.Models(decision(t, a, tt.decision)); !reflect.DeepEqual(got, tt.want) {
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
		{"an engine target without models is valid: it serves the engine's", func(t *Target) { t.Kind, t.Tier, t.Endpoint, t.Models = KindEngine, "T0", "", nil }, ""},
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
		{"an unknown endpoint kind", func(t *Target) { t.Endpoints = []string{"images"} }, `target a: endpoint kind "images" must be chat.completions, completions or embeddings`},
		{"a quality above 1", func(t *Target) { t.Quality = map[string]float64{"chat": 1.5} }, "target a: quality chat = 1.5 must be in [0,1]"},
		{"a negative price", func(t *Target) { t.PriceOut = -1 }, "target a: price_in, price_out, latency_ms, max_context and timeout_ms must not be negative"},
		{"a negative context", func(t *Target) { t.MaxContext = -1 }, "target a: price_in, price_out, latency_ms, max_context and timeout_ms must not be negative"},
		{"a negative timeout", func(t *Target) { t.TimeoutMS = -1 }, "target a: price_in, price_out, latency_ms, max_context and timeout_ms must not be negative"},
		{"drafting for a T1 target is valid", func(t *Target) { t.DraftWithEngine, t.DraftTokens = true, 8 }, ""},
		{"drafting for an engine target", func(t *Target) { t.Kind, t.Tier, t.DraftWithEngine = KindEngine, "T0", true },
			"target a: draft_with_engine is for a kind openai target of tier T1 or T2 (a Molly engine on another machine), not engine T0"},
		{"drafting for an external API", func(t *Target) { t.Tier, t.DraftWithEngine = "T3", true },
			"target a: draft_with_engine is for a kind openai target of tier T1 or T2 (a Molly engine on another machine), not openai T3"},
		{"draft_tokens without drafting", func(t *Target) { t.DraftTokens = 4 }, "target a: draft_tokens 4 must be 1..64, with draft_with_engine"},
		{"too many draft tokens", func(t *Target) { t.DraftWithEngine, t.DraftTokens = true, 65 }, "target a: draft_tokens 65 must be 1..64, with draft_with_engine"},
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
	t.Run("drafting needs an engine", func(t *testing.T) {
		_, err := NewCatalogue([]*Target{{Name: "lan", Tier: "T1", Endpoint: "http://127.0.0.1:1/v1", Models: []string{"m"}, DraftWithEngine: true}}, nil)
		if got := errString(err); got != "target lan: draft_with_engine needs the molly app's engine, and none is configured" {
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
		ts := []*Target{
			{Name: "lan", Tier: "T1", Endpoint: "http://127.0.0.1:1/v1/", Models: []string{"m"}},
			{Name: "remote", Tier: "T2", Endpoint: "http://127.0.0.1:2/v1", Models: []string{"m=up"}, TimeoutMS: 1500},
			{Name: "engine", Tier: "T0", Kind: KindEngine, Models: []string{"m"}, Modalities: []string{"text", "image"}},
		}
		c, err := NewCatalogue(ts, demoEngine(t))
		if err != nil {
			t.Fatal(err)
		}
		if got := c.Targets(); len(got) != 3 || got[0] != ts[0] || got[2] != ts[2] {
			t.Fatalf("Targets = %v", got)
		}
		if ts[0].Region != "local" || ts[1].Region != "" || ts[2].Region != "local" {
			t.Errorf("regions = %q, %q, %q; want local, \"\", local", ts[0].Region, ts[1].Region, ts[2].Region)
		}
		if !reflect.DeepEqual(ts[0].Modalities, []string{"text"}) || !reflect.DeepEqual(ts[2].Modalities, []string{"text", "image"}) {
			t.Errorf("modalities = %v, %v", ts[0].Modalities, ts[2].Modalities)
		}
		if !reflect.DeepEqual(ts[2].Endpoints, []string{"chat.completions", "completions", "embeddings"}) || ts[0].Endpoints != nil {
			t.Errorf("endpoints = %v, %v; the engine serves chat, completions and embeddings, others everything", ts[2].Endpoints, ts[0].Endpoints)
		}
		if ts[0].Timeout() != 30*time.Second || ts[1].Timeout() != 1500*time.Millisecond {
			t.Errorf("timeouts = %v, %v; want the 30 s default and 1.5 s", ts[0].Timeout(), ts[1].Timeout())
		}
		want := map[string]any{"name": "remote", "tier": "T2", "kind": "openai", "region": "", "models": []any{"m"}, "price_in": 0.0, "price_out": 0.0}
		if got := ts[1].PolicyView(); !reflect.DeepEqual(got, want) {
			t.Errorf("PolicyView = %v, want %v", got, want)
		}
		// The engine target serves its alias and every model the engine serves now.
		want = map[string]any{"name": "engine", "tier": "T0", "kind": "engine", "region": "local", "price_in": 0.0, "price_out": 0.0,
			"models": []any{"m", "molly-demo", "molly-demo:billing", "molly-demo:legal", "molly-demo:payments", "molly-demo:support"}}
		if got := ts[2].PolicyView(); !reflect.DeepEqual(got, want) {
			t.Errorf("engine PolicyView = %v, want %v", got, want)
		}
		if got := c.PolicyView(); len(got) != 3 || !reflect.DeepEqual(got[1], ts[1].PolicyView()) {
			t.Errorf("catalogue PolicyView = %v", got)
		}
	})
}

func TestCost(t *testing.T) {
	tg := &Target{PriceIn: 5, PriceOut: 15}
	// 1000 prompt tokens at 5 USD/1M plus 500 completion tokens at 15 USD/1M.
	if got := tg.Cost(1000, 500); got != 0.0125 {
		t.Fatalf("Cost = %v, want 0.0125", got)
	}
}
