package envoy

import (
	"bytes"
	"context"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/molly-gateway/molly/internal/canarytest"
	"github.com/molly-gateway/molly/router/classify"
	"github.com/molly-gateway/molly/router/identity"
	"github.com/molly-gateway/molly/router/openai"
	"github.com/molly-gateway/molly/router/route"
)

// TestFleetCanaryResidency sends the residency canary corpus of the
// pipeline (internal/canarytest: canaries planted anywhere in valid chat
// bodies) through the policy point with Envoy's message sequence, in both
// body modes and cut into random pieces, and checks the two halves of the
// invariant in fleet mode: no request is told to route to a cluster
// outside the tiers its policy decision allows, and no body the policy
// point returns for a T3 cluster carries a canary unredacted
// (canarytest.Leaked, which does not use the detectors); and the body it
// returns is byte for byte the pipeline's dispatch for that target. The card canary
// is confidential here (LAN only), the pattern canary public (T3 allowed,
// redacted). At most 400 cases or 15 s; `make fuzz` runs the pipeline's
// fuzz target for longer.
func TestFleetCanaryResidency(t *testing.T) {
	targets := []*route.Target{
		{Name: "lan", Tier: "T1", Models: []string{"m"}, Quality: map[string]float64{"default": 0.5}},
		{Name: "ext-a", Tier: "T3", Models: []string{"m"}, Quality: map[string]float64{"default": 0.9}, PriceIn: 1, PriceOut: 1},
		{Name: "ext-b", Tier: "T3", Models: []string{"m"}, Quality: map[string]float64{"default": 0.8}, PriceIn: 1, PriceOut: 1},
	}
	tierOf := map[string]string{"lan": "T1", "ext-a": "T3", "ext-b": "T3"}
	overrides := map[string]classify.Sensitivity{"CANARY": classify.Public, "CREDIT_CARD": classify.Confidential}
	patterns := map[string][]string{"CANARY": {canarytest.Pattern}}
	f := startFleet(t, fleetOptions{targets: targets, ups: []string{"lan", "ext-a", "ext-b"}, overrides: overrides, patterns: patterns})
	pp, cl := f.pipeline, f.pp.Classifier // the decision each request gets, for the tier half of the oracle
	r := rand.New(rand.NewPCG(19, 7))
	deadline := time.Now().Add(15 * time.Second)
	n, toT3 := 0, 0
	for ; n < 400 && time.Now().Before(deadline); n++ {
		c := canarytest.Generate(r)
		call := post(c.Body)
		call.buffered = r.IntN(2) == 0
		call.reqPieces, call.respPieces = 1+r.IntN(9), 1+r.IntN(9)
		out := f.play(t, call)
		if out.immediate != nil {
			if out.status == 500 {
				t.Fatalf("case %d: %d for %s: %s", n, out.status, c.Body, out.body)
			}
			continue // nothing left Molly
		}
		a, err := cl.Classify(classify.Input{Endpoint: openai.EndpointChat, Path: "/v1/chat/completions", Body: c.Body})
		if err != nil {
			t.Fatalf("case %d: the policy point routed a body the classifier refuses: %v", n, err)
		}
		anon := &identity.Identity{Member: "anonymous"}
		d := pp.Decide(identity.With(context.Background(), anon), a, anon)
		allowed := d.Decision().Tiers()
		tier := tierOf[out.cluster]
		// Fleet mode sends exactly what the pipeline's dispatch for that
		// target would send.
		var tg *route.Target
		for _, x := range f.cat.Targets() {
			if x.Name == out.cluster {
				tg = x
			}
		}
		if disp, err := pp.Egress.NewDispatch(d, a, route.Candidate{Target: tg, Model: "m"}); err != nil || !bytes.Equal(disp.Body(), out.sent) {
			t.Errorf("case %d: the body returned for %s is not the dispatch's (%v)\nreturned: %s", n, out.cluster, err, out.sent)
		}
		if !slices.Contains(allowed, tier) {
			t.Errorf("case %d: told to route to %s (%s); the decision allows %v\nsent: %s", n, out.cluster, tier, allowed, c.Body)
		}
		if tier == "T3" {
			toT3++
			if canarytest.Leaked(out.sent, c.Canary) {
				t.Errorf("case %d: canary %s in the body returned for T3 cluster %s\nsent:     %s\nreturned: %s", n, c.Canary, out.cluster, c.Body, out.sent)
			}
		}
	}
	if toT3 == 0 || toT3 == n {
		t.Fatalf("%d of %d cases went to T3: the corpus does not exercise both halves", toT3, n)
	}
	t.Logf("%d cases, %d routed to T3", n, toT3)
}
