package router

import (
	"errors"
	"math"
	"net/http"
	"reflect"
	"testing"
	"time"
)

func TestRankWithOverrides(t *testing.T) {
	all := []string{"T0", "T1", "T2", "T3"}
	tests := []struct {
		name     string
		decision map[string]any
		o        Overrides
		want     []ranked
		excluded []Exclusion
	}{
		{"X-Molly-Max-Cost below the cloud's expected cost excludes it",
			decisionMap(all, nil), Overrides{MaxCostUSD: 0.005, HasMaxCost: true},
			[]ranked{rLAN, rLocal}, []Exclusion{{"cloud", "expected cost 0.012500 USD over X-Molly-Max-Cost 0.005000"}}},
		{"X-Molly-Max-Cost 0 keeps the free targets only",
			decisionMap(all, nil), Overrides{HasMaxCost: true},
			[]ranked{rLocal}, []Exclusion{{"lan", "expected cost 0.002000 USD over X-Molly-Max-Cost 0.000000"}, {"cloud", "expected cost 0.012500 USD over X-Molly-Max-Cost 0.000000"}}},
		{"the policy's max_cost_usd is checked before the header's",
			decisionMap(all, map[string]any{"max_cost_usd": 0.001}), Overrides{MaxCostUSD: 1, HasMaxCost: true},
			[]ranked{rLocal}, []Exclusion{{"lan", "expected cost 0.002000 USD over the policy limit 0.001000"}, {"cloud", "expected cost 0.012500 USD over the policy limit 0.001000"}}},
		{"prefer best orders by quality alone",
			decisionMap(all, nil), Overrides{Prefer: PreferBest},
			[]ranked{withScore(rCloud, 0.9), withScore(rLAN, 0.7), withScore(rLocal, 0.6)}, nil},
		{"prefer cheap weighs a dollar 100 quality points: the free target wins",
			decisionMap(all, nil), Overrides{Prefer: PreferCheap},
			[]ranked{withScore(rLocal, 0.6-0.05*2), withScore(rLAN, 0.7-100*0.002-0.05*1), withScore(rCloud, 0.9-100*0.0125-0.05*0.5)}, nil},
		{"prefer local costs remote tiers 0.1 per step from T0",
			decisionMap(all, nil), Overrides{Prefer: PreferLocal},
			[]ranked{withScore(rLAN, 0.63-0.1), withScore(rLocal, 0.5), withScore(rCloud, 0.75-0.3)}, nil},
		{"prefer local does not lift a tier the policy excluded",
			decisionMap([]string{"T3"}, nil), Overrides{Prefer: PreferLocal},
			[]ranked{withScore(rCloud, 0.75-0.3)}, []Exclusion{{"local", "tier T0 not allowed by the policy"}, {"lan", "tier T1 not allowed by the policy"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := newCatalogue(t, rankTargets()...)
			cands, excluded, known := c.RankWith(rankRequest(), decisionOf(t, tt.decision), Selection{Weights: DefaultWeights, Overrides: tt.o})
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
		{"an unknown preference is refused", map[string]string{"X-Molly-Prefer": "fast"}, Overrides{}, "X-Molly-Prefer"},
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

func TestLearnedPriorsChangeLaterDecisions(t *testing.T) {
	d := decisionOf(t, decisionMap([]string{"T0", "T1", "T2", "T3"}, nil))
	cloudChat := PriorKey{"cloud", "gpt-m", "chat"}
	rank := func(p *Priors, stream bool) []ranked {
		c := newCatalogue(t, rankTargets()...)
		a := rankRequest()
		a.Stream = stream
		cands, _, _ := c.RankWith(a, d, Selection{Weights: DefaultWeights, Priors: p})
		return rankedOf(cands)
	}
	t.Run("without observations the configured seeds rank", func(t *testing.T) {
		if got := rank(NewPriors(), false); !sameRanked(got, []ranked{rCloud, rLAN, rLocal}) {
			t.Fatalf("got %v", got)
		}
	})
	t.Run("one bad score moves the cloud's prior by α but it stays first", func(t *testing.T) {
		p := NewPriors()
		if q, err := p.ObserveQuality(cloudChat, 0.9, 0); err != nil || math.Abs(q-0.81) > 1e-12 {
			t.Fatalf("ObserveQuality = %v, %v; want 0.81", q, err)
		}
		want := []ranked{{"cloud", "gpt-m", 0.81, 0.0125, 0.5, 0.81 - 0.125 - 0.025}, rLAN, rLocal}
		if got := rank(p, false); !sameRanked(got, want) {
			t.Fatalf("got %v\nwant %v", got, want)
		}
	})
	t.Run("two bad scores put lan first", func(t *testing.T) {
		p := NewPriors()
		p.ObserveQuality(cloudChat, 0.9, 0)
		p.ObserveQuality(cloudChat, 0.9, 0) // 0.9 · 0.9 · 0.9 = 0.729
		want := []ranked{rLAN, {"cloud", "gpt-m", 0.729, 0.0125, 0.5, 0.729 - 0.125 - 0.025}, rLocal}
		if got := rank(p, false); !sameRanked(got, want) {
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
		if got := rank(p, false); !sameRanked(got, []ranked{rCloud, rLAN, {"local", "local-m", 0.6, 0, 0.2, 0.6 - 0.05*0.2}}) {
			t.Fatalf("whole answer: got %v", got)
		}
		if got := rank(p, true); !sameRanked(got, []ranked{rCloud, rLAN, {"local", "local-m", 0.6, 0, 0.1, 0.6 - 0.05*0.1}}) {
			t.Fatalf("stream: got %v", got)
		}
		p.ObserveLatency("local", 300*time.Millisecond, 400*time.Millisecond)
		if l, ok := p.Latency("local", false); !ok || math.Abs(l-(0.7*0.2+0.3*0.4)) > 1e-12 {
			t.Fatalf("total latency EWMA = %v, want 0.26", l)
		}
	})
}

// fakeEngine serves the model names it is given.
type fakeEngine struct{ models []string }

func (e fakeEngine) ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write([]byte(`{"object":"chat.completion","choices":[{"index":0,"finish_reason":"stop","message":{"role":"assistant","content":"ok"}}],"usage":{"prompt_tokens":7,"completion_tokens":2,"total_tokens":9}}`))
}

func (e fakeEngine) Models() []string { return e.models }

func adapterCatalogue(t *testing.T) *Catalogue {
	t.Helper()
	c, err := NewCatalogue([]*Target{
		{Name: "device", Tier: "T0", Kind: KindEngine, Models: []string{"chat=molly-demo"}, LatencyMS: 50,
			Quality: map[string]float64{"default": 0.3, "billing": 0.9}},
		{Name: "lan", Tier: "T1", Endpoint: "http://127.0.0.1:1/v1", Models: []string{"chat"}, LatencyMS: 1000,
			Quality: map[string]float64{"default": 0.7}},
	}, fakeEngine{[]string{"molly-demo", "molly-demo:billing", "molly-demo:legal"}})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestAdapterVariantCandidates(t *testing.T) {
	d := decisionOf(t, decisionMap([]string{"T0", "T1"}, nil))
	base := ranked{"device", "molly-demo", 0.3, 0, 0.05, 0.3 - 0.05*0.05}
	lan := ranked{"lan", "chat", 0.7, 0, 1, 0.7 - 0.05}
	tests := []struct {
		name, task, model string
		want              []ranked
	}{
		{"a billing task on a generic name adds the billing adapter, which outranks the unadapted T1 target", "billing", "chat",
			[]ranked{{"device", "molly-demo:billing", 0.9, 0, 0.05, 0.9 - 0.05*0.05}, lan, base}},
		{"a task no adapter is named for adds nothing", "coding", "chat", []ranked{lan, base}},
		{"a client that named the base model directly gets the adapter too", "billing", "molly-demo",
			[]ranked{{"device", "molly-demo:billing", 0.9, 0, 0.05, 0.9 - 0.05*0.05}, base}},
		{"a client that named another adapter keeps it, with the target's default prior", "billing", "molly-demo:legal",
			[]ranked{{"device", "molly-demo:legal", 0.3, 0, 0.05, 0.3 - 0.05*0.05}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := rankRequest()
			a.Task, a.Model = tt.task, tt.model
			cands, _, _ := adapterCatalogue(t).RankWith(a, d, Selection{Weights: DefaultWeights})
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
		a := rankRequest()
		a.Task, a.Model = "billing", "chat"
		cands, _, _ := adapterCatalogue(t).RankWith(a, d, Selection{Weights: DefaultWeights, Priors: p})
		want := []ranked{{"device", "molly-demo:billing", 0.6561, 0, 0.05, 0.6561 - 0.0025}, lan, base}
		if got := rankedOf(cands); !sameRanked(got, want) {
			t.Fatalf("after 3 scores of 0: got %v\nwant %v", got, want)
		}
		p.ObserveQuality(key, 0.9, 0) // 0.59049
		cands, _, _ = adapterCatalogue(t).RankWith(a, d, Selection{Weights: DefaultWeights, Priors: p})
		want = []ranked{lan, {"device", "molly-demo:billing", 0.59049, 0, 0.05, 0.59049 - 0.0025}, base}
		if got := rankedOf(cands); !sameRanked(got, want) {
			t.Fatalf("after 4: got %v\nwant %v", got, want)
		}
		if cands[1].Adapter() != "billing" || cands[0].Adapter() != "" || cands[1].Learned != 4 {
			t.Fatalf("adapters %q, %q; learned %d", cands[1].Adapter(), cands[0].Adapter(), cands[1].Learned)
		}
	})
	t.Run("the catalogue's domains are the engine's adapter names", func(t *testing.T) {
		if got := adapterCatalogue(t).Domains(); !reflect.DeepEqual(got, []string{"billing", "legal"}) {
			t.Fatalf("Domains = %q", got)
		}
	})
}

func TestRouteHeader(t *testing.T) {
	c := newCatalogue(t, rankTargets()...)
	cands, _, _ := c.Rank(rankRequest(), decisionOf(t, decisionMap([]string{"T0", "T1", "T2", "T3"}, nil)), DefaultWeights)
	tests := []struct {
		name   string
		chosen Candidate
		cands  []Candidate
		want   string
	}{
		{"the first choice names the runner-up", cands[0], cands, "cloud/gpt-m score=0.7500; runner-up lan/m score=0.6300"},
		{"a fallback says so and names the best other candidate", cands[1], cands, "lan/m score=0.6300; runner-up cloud/gpt-m score=0.7500; fallback"},
		{"a lone candidate has no runner-up", cands[2], cands[2:], "local/local-m score=0.5000; runner-up none"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := RouteHeader(tt.chosen, tt.cands); got != tt.want {
				t.Fatalf("RouteHeader = %q, want %q", got, tt.want)
			}
		})
	}
}

func TestFeedback(t *testing.T) {
	key := PriorKey{"lan", "m", "chat"}
	t.Run("an unknown decision id is ErrUnknownDecision", func(t *testing.T) {
		if _, err := NewPriors().Feedback("nope", 1); !errors.Is(err, ErrUnknownDecision) {
			t.Fatalf("err = %v", err)
		}
	})
	t.Run("a score moves the remembered candidate's prior from the quality it was chosen with", func(t *testing.T) {
		p := NewPriors()
		p.Remember("d1", key, 0.7)
		res, err := p.Feedback("d1", 0.2)
		if err != nil || res.Key != key || math.Abs(res.Quality-(0.9*0.7+0.1*0.2)) > 1e-12 || res.N != 1 {
			t.Fatalf("Feedback = %+v, %v; want quality 0.65 after 1", res, err)
		}
		if _, err := p.Feedback("d1", 1); !errors.Is(err, ErrFeedbackGiven) {
			t.Fatalf("second feedback err = %v, want ErrFeedbackGiven", err)
		}
	})
	t.Run("a score outside [0,1] is refused", func(t *testing.T) {
		p := NewPriors()
		p.Remember("d1", key, 0.7)
		for _, s := range []float64{-0.1, 1.5, math.NaN()} {
			if _, err := p.Feedback("d1", s); err == nil {
				t.Fatalf("score %v accepted", s)
			}
		}
	})
	t.Run("decisions older than the TTL are forgotten", func(t *testing.T) {
		now := time.Unix(1000, 0)
		p := &Priors{Now: func() time.Time { return now }}
		p.Remember("d1", key, 0.7)
		now = now.Add(DefaultDecisionTTL + time.Second)
		if _, err := p.Feedback("d1", 1); !errors.Is(err, ErrUnknownDecision) {
			t.Fatalf("err = %v, want ErrUnknownDecision", err)
		}
	})
	t.Run("a full memory forgets the oldest decision first", func(t *testing.T) {
		p := &Priors{DecisionCapacity: 2}
		p.Remember("d1", key, 0.7)
		p.Remember("d2", key, 0.7)
		p.Remember("d3", key, 0.7)
		if _, err := p.Feedback("d1", 1); !errors.Is(err, ErrUnknownDecision) {
			t.Fatalf("d1: err = %v, want ErrUnknownDecision", err)
		}
		for _, id := range []string{"d2", "d3"} {
			if _, err := p.Feedback(id, 1); err != nil {
				t.Fatalf("%s: %v", id, err)
			}
		}
	})
}

func TestPriorsSurviveARestartThroughTheirStore(t *testing.T) {
	store := &MemoryPriorStore{}
	p := NewPriors()
	if err := p.Attach(store); err != nil {
		t.Fatal(err)
	}
	p.Remember("d1", PriorKey{"lan", "m", "chat"}, 0.7)
	if _, err := p.Feedback("d1", 0); err != nil {
		t.Fatal(err)
	}
	p.ObserveLatency("lan", 100*time.Millisecond, 300*time.Millisecond)
	// Feedback is saved at once; the latency waits for a flush.
	if recs, _ := store.Load(); len(recs) != 1 || recs[0].Kind != PriorQuality || math.Abs(recs[0].Value-0.63) > 1e-12 {
		t.Fatalf("before Close the store holds %+v, want the quality 0.63 only", recs)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	again := NewPriors()
	if err := again.Attach(store); err != nil {
		t.Fatal(err)
	}
	if q, n := again.Quality(PriorKey{"lan", "m", "chat"}, 0.7); math.Abs(q-0.63) > 1e-12 || n != 1 {
		t.Fatalf("quality after restart = %v (%d), want 0.63 (1)", q, n)
	}
	if l, ok := again.Latency("lan", true); !ok || l != 0.1 {
		t.Fatalf("ttfb after restart = %v, %v; want 0.1", l, ok)
	}
}

func TestThroughputIsLearnedPerTargetAndModelAndSurvivesARestart(t *testing.T) {
	store := &MemoryPriorStore{}
	p := NewPriors()
	if err := p.Attach(store); err != nil {
		t.Fatal(err)
	}
	if _, ok := p.Throughput("lan", "m"); ok {
		t.Fatal("a throughput before any observation")
	}
	p.ObserveThroughput("lan", "m", 50, 2*time.Second) // 25 tokens/s replaces the empty prior
	p.ObserveThroughput("lan", "m", 0, time.Second)    // nothing generated: ignored
	if v, ok := p.Throughput("lan", "m"); !ok || v != 25 {
		t.Fatalf("throughput %v, %v; want 25", v, ok)
	}
	p.ObserveThroughput("lan", "m", 45, time.Second) // 45 tokens/s: EWMA 0.3·45 + 0.7·25
	if v, _ := p.Throughput("lan", "m"); math.Abs(v-(DefaultLatencyAlpha*45+(1-DefaultLatencyAlpha)*25)) > 1e-9 {
		t.Fatalf("throughput %v after a second observation", v)
	}
	if _, ok := p.Throughput("lan", "other"); ok {
		t.Fatal("throughput leaked to another model")
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	again := NewPriors()
	if err := again.Attach(store); err != nil {
		t.Fatal(err)
	}
	if v, ok := again.Throughput("lan", "m"); !ok || math.Abs(v-(DefaultLatencyAlpha*45+(1-DefaultLatencyAlpha)*25)) > 1e-9 {
		t.Fatalf("throughput after restart %v, %v", v, ok)
	}
}
