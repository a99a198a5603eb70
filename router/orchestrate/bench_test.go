package orchestrate

import (
	"context"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/molly-gateway/molly/router/classify"
	"github.com/molly-gateway/molly/router/openai"
	"github.com/molly-gateway/molly/router/route"
)

// BenchmarkOrchestrationOverhead measures an orchestrated request of two
// parallel subtasks against its baseline, measured in the same
// iteration: the same two subtask requests (the bodies the specialist
// received) sent as plain requests in parallel through the same gateway.
// overhead-ns/op is the difference: the parent's walk, planning, the
// orchestration policy, fusion, the check and the response.
func BenchmarkOrchestrationOverhead(b *testing.B) {
	spec := startScripted(b, "spec")
	g := startGateway(b, setup{targets: []*route.Target{target("spec", "T1", spec.url(), 0.5, "m")}})
	body := chat("m", "1. Translate hello into French.\n2. Summarise the plot of Hamlet.")
	ctx := context.Background()
	if r := post(b, ctx, g.url, body, HeaderMode, ModeOrchestrate); r.status != http.StatusOK {
		b.Fatalf("status %d: %s", r.status, r.body)
	}
	calls := spec.received()
	if len(calls) != 2 {
		b.Fatalf("%d subtask requests, want 2", len(calls))
	}
	subtasks := []string{string(calls[0].body), string(calls[1].body)}
	var base, orch time.Duration
	b.ResetTimer()
	for b.Loop() {
		start := time.Now()
		var wg sync.WaitGroup
		for _, s := range subtasks {
			wg.Go(func() {
				if r := post(b, ctx, g.url, s); r.status != http.StatusOK {
					b.Errorf("subtask status %d", r.status)
				}
			})
		}
		wg.Wait()
		base += time.Since(start)
		start = time.Now()
		if r := post(b, ctx, g.url, body, HeaderMode, ModeOrchestrate); r.status != http.StatusOK {
			b.Fatalf("status %d", r.status)
		}
		orch += time.Since(start)
	}
	n := float64(b.N)
	b.ReportMetric(float64(base.Nanoseconds())/n, "subtasks-ns/op")
	b.ReportMetric(float64(orch.Nanoseconds())/n, "orchestrated-ns/op")
	b.ReportMetric(float64((orch-base).Nanoseconds())/n, "overhead-ns/op")
}

// BenchmarkTriage is the cost triage adds to every routed chat request:
// a simple request with auto triage off (the default: a header and a
// model name compared) and on (the sentence test, and the estimator when
// the text has several sentences).
func BenchmarkTriage(b *testing.B) {
	spec := startScripted(b, "spec")
	cls := testClassifier(b)
	for _, c := range []struct {
		name string
		auto bool
		text string
	}{
		{"auto=off", false, "Translate hello into French."},
		{"auto=on/one sentence", true, "Translate hello into French."},
		{"auto=on/two sentences", true, "Translate hello into French. Translate goodbye into German."},
	} {
		g := startGateway(b, setup{targets: []*route.Target{target("spec", "T1", spec.url(), 0.5, "m")}, cfg: Config{Auto: c.auto}})
		a, err := cls.Classify(classify.Input{Endpoint: openai.EndpointChat, Body: []byte(chat("m", c.text))})
		if err != nil {
			b.Fatal(err)
		}
		r, _ := http.NewRequest(http.MethodPost, "/v1/chat/completions", nil)
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if ok, err := g.o.Triage(r, a); ok || err != nil {
					b.Fatal("a simple request was triaged as composite")
				}
			}
		})
	}
}
