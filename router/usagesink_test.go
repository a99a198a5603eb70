package router

import (
	"fmt"
	"reflect"
	"sync"
	"testing"

	"github.com/molly-gateway/molly/internal/upstreamtest"
)

// TestUsageSink: the forwarder hands every usage record to UsageSink with
// the values the ledger gets, streams included, and as member "anonymous"
// when no identity (molly_auth) is present.
func TestUsageSink(t *testing.T) {
	up := upstreamtest.Start("up")
	t.Cleanup(up.Close)
	quiet := silent(t)
	cat := newCatalogue(t,
		&Target{Name: "reporting", Tier: "T2", Endpoint: up.URL(), Models: []string{"m"}, PriceIn: 1, PriceOut: 2},
		&Target{Name: "quiet", Tier: "T2", Endpoint: quiet.URL + "/v1", Models: []string{"q"}, PriceIn: 1000, PriceOut: 1000})
	var mu sync.Mutex
	var sunk []Usage
	sink := func(u Usage) {
		mu.Lock()
		defer mu.Unlock()
		sunk = append(sunk, u)
	}
	take := func() []Usage {
		mu.Lock()
		defer mu.Unlock()
		out := sunk
		sunk = nil
		return out
	}
	ledger := &memLedger{}
	alice := forwarderGateway(t, &Forwarder{Catalogue: cat, Weights: DefaultWeights, UsageSink: sink}, &Identity{Member: "alice", Ledger: ledger})
	anon := forwarderGateway(t, &Forwarder{Catalogue: cat, Weights: DefaultWeights, UsageSink: sink}, nil)
	req := func(model, extra string) string {
		return `{"model":"` + model + `",` + extra + `"messages":[{"role":"user","content":"hi there"}]}`
	}
	tests := []struct {
		name, url, body string
		want            Usage
		ledgered        bool
	}{
		{"whole answer", alice.URL, req("m", ""),
			Usage{Member: "alice", Model: "m", Target: "reporting", Tier: "T2", PromptTokens: 5, CompletionTokens: 5, CostUSD: 15e-6}, true},
		{"stream with a usage chunk", alice.URL, req("m", `"stream":true,`),
			Usage{Member: "alice", Model: "m", Target: "reporting", Tier: "T2", PromptTokens: 5, CompletionTokens: 4, CostUSD: 13e-6}, true},
		{"stream counted by Molly", alice.URL, req("q", `"stream":true,`),
			Usage{Member: "alice", Model: "q", Target: "quiet", Tier: "T2", PromptTokens: 8, CompletionTokens: 3, Estimated: true, CostUSD: 11e-3}, true},
		{"anonymous whole answer", anon.URL, req("m", ""),
			Usage{Member: "anonymous", Model: "m", Target: "reporting", Tier: "T2", PromptTokens: 5, CompletionTokens: 5, CostUSD: 15e-6}, false},
		{"anonymous stream", anon.URL, req("q", `"stream":true,`),
			Usage{Member: "anonymous", Model: "q", Target: "quiet", Tier: "T2", PromptTokens: 8, CompletionTokens: 3, Estimated: true, CostUSD: 11e-3}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := post(t, tt.url+"/v1/chat/completions", tt.body, "X-Molly-Sensitivity", "internal")
			if r.status != 200 {
				t.Fatalf("status %d: %s", r.status, r.body)
			}
			got, led := take(), ledger.take()
			if len(got) != 1 {
				t.Fatalf("sink got %d usages, want 1: %+v", len(got), got)
			}
			u := got[0]
			if tt.ledgered && (len(led) != 1 || !reflect.DeepEqual(led[0], u)) {
				t.Fatalf("ledger got %+v, sink %+v", led, u)
			}
			if !tt.ledgered && len(led) != 0 {
				t.Fatalf("ledger got %+v without an identity", led)
			}
			if u.DecisionID != r.header.Get(HeaderDecisionID) || u.DecisionID == "" || u.Time.IsZero() {
				t.Fatalf("decision id %q (header %q), time %v", u.DecisionID, r.header.Get(HeaderDecisionID), u.Time)
			}
			if fmt.Sprintf("%.9f", u.CostUSD) != fmt.Sprintf("%.9f", tt.want.CostUSD) {
				t.Fatalf("cost %v, want %v", u.CostUSD, tt.want.CostUSD)
			}
			u.DecisionID, u.Time, u.CostUSD = "", tt.want.Time, tt.want.CostUSD
			if !reflect.DeepEqual(u, tt.want) {
				t.Fatalf("sunk %+v\nwant %+v", u, tt.want)
			}
		})
	}
	t.Run("a failed upstream sends nothing", func(t *testing.T) {
		r := post(t, anon.URL+"/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"FAIL500"}]}`)
		if r.status != 503 || len(take()) != 0 {
			t.Fatalf("status %d: %s", r.status, r.body)
		}
	})
}
