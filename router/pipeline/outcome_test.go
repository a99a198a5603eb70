package pipeline

import (
	"sync"
	"testing"

	"github.com/molly-gateway/molly/internal/upstreamtest"
	"github.com/molly-gateway/molly/router/identity"
	"github.com/molly-gateway/molly/router/route"
)

// outcomes records what the pipeline reports.
type outcomes struct {
	mu  sync.Mutex
	got []Outcome
}

func (o *outcomes) Record(out Outcome) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.got = append(o.got, out)
}

func (o *outcomes) take() []Outcome {
	o.mu.Lock()
	defer o.mu.Unlock()
	out := o.got
	o.got = nil
	return out
}

// TestEveryRequestEndsInOneOutcome: the answered request, the fallback,
// the policy denial and the request every target failed each reach the
// recorders once, with their attempts in order and no text.
func TestEveryRequestEndsInOneOutcome(t *testing.T) {
	good := upstreamtest.Start("good")
	t.Cleanup(good.Close)
	rec := &outcomes{}
	gw, _ := startGateway(t, setup{targets: []*route.Target{
		{Name: "best", Tier: "T1", Endpoint: "http://127.0.0.1:1/v1", Models: []string{"m"}, Quality: map[string]float64{"default": 0.9}},
		{Name: "good", Tier: "T1", Endpoint: good.URL(), Models: []string{"m", "only-best"}, Quality: map[string]float64{"default": 0.5}},
	}, edit: func(p *Pipeline) { p.Recorders = []Recorder{rec} }})
	url := gw.URL + "/v1/chat/completions"

	r := post(t, url, chatBody("hello"))
	got := rec.take()
	if r.status != 200 || len(got) != 1 {
		t.Fatalf("status %d, %d outcomes", r.status, len(got))
	}
	o := got[0]
	if o.Label != "fallback" || o.Status != 200 || o.Answered != 1 || len(o.Attempts) != 2 ||
		o.Attempts[0].Target != "best" || o.Attempts[0].Failure != "connect" || o.Attempts[0].Delivered ||
		o.Attempts[1].Target != "good" || !o.Attempts[1].Delivered || o.Attempts[1].PromptTokens != 5 || o.Attempts[1].CompletionTokens != 5 ||
		o.DecisionID != r.header.Get(HeaderDecisionID) || o.Member != "anonymous" || o.Model != "m" || o.Plan.Strategy != route.StrategySingle {
		t.Fatalf("outcome %+v", o)
	}

	scoped, _ := startGateway(t, setup{targets: []*route.Target{{Name: "good", Tier: "T1", Endpoint: good.URL(), Models: []string{"m"}}},
		id: &identity.Identity{Member: "ann", Models: []string{"other"}}, edit: func(p *Pipeline) { p.Recorders = []Recorder{rec} }})
	r = post(t, scoped.URL+"/v1/chat/completions", chatBody("hello"))
	if got = rec.take(); r.status != 403 || len(got) != 1 || got[0].Label != "denied" || got[0].Status != 403 || got[0].Member != "ann" || len(got[0].Attempts) != 0 {
		t.Fatalf("status %d, outcomes %+v", r.status, got)
	}

	r = post(t, url, chatBody("my key is AKIAIOSFODNN7EXAMPLE")) // restricted: T0 only, none here: no retry helps
	if got = rec.take(); len(got) != 1 || got[0].Label != "no_target" || got[0].Status != 403 || got[0].Answered != -1 || got[0].Sensitivity != "restricted" {
		t.Fatalf("status %d, outcomes %+v", r.status, got)
	}
}
