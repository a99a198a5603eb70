package observe

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/molly-gateway/molly/policies"
	"github.com/molly-gateway/molly/router/pipeline"
	"github.com/molly-gateway/molly/router/route"
)

// TestRecordCountsOutcomes: a cascade that went past a T1 answer and a
// failed T2 to a T3 answer with two e-mail addresses redacted, and a
// denial, counted as a person would count them.
func TestRecordCountsOutcomes(t *testing.T) {
	m := NewMetrics()
	m.Record(pipeline.Outcome{Model: "chat", Endpoint: "chat.completions", Label: "escalated", Plan: route.Plan{Strategy: route.StrategyCascade},
		Findings: map[string]int{"EMAIL": 2, "PHONE": 1}, RedactedTypes: []string{"EMAIL"}, Answered: 2,
		Attempts: []pipeline.Attempt{{Target: "lan", Tier: "T1"}, {Target: "broken", Tier: "T2", Failure: "connect"}, {Target: "ext", Tier: "T3", Delivered: true}}})
	m.Record(pipeline.Outcome{Model: "chat", Endpoint: "chat.completions", Label: "denied", Code: "model_not_allowed", Answered: -1})
	m.Record(pipeline.Outcome{Model: "chat", Endpoint: "chat.completions", Label: "failed", Answered: -1, Plan: route.Plan{Strategy: route.StrategySingle},
		Attempts: []pipeline.Attempt{{Target: "a", Tier: "T1", Failure: "timeout"}, {Target: "b", Tier: "T1", Failure: "server_error"}}})
	for _, c := range []struct {
		c    prometheus.Collector
		want float64
	}{
		{m.escalations.WithLabelValues("T1", "T3"), 1},
		{m.fallbacks.WithLabelValues("connect", "T2", "broken"), 1},
		{m.fallbacks.WithLabelValues("timeout", "T1", "a"), 1},
		{m.redactions.WithLabelValues("EMAIL", "T3"), 2},
		{m.outcomes.WithLabelValues("chat", "chat", "T3", "escalated"), 1},
		{m.outcomes.WithLabelValues("chat", "chat", "", "denied"), 1},
		{m.denials.WithLabelValues("model_not_allowed"), 1},
		{m.denials.WithLabelValues("policy_error"), 0},
	} {
		if got := testutil.ToFloat64(c.c); got != c.want {
			t.Errorf("%v = %v, want %v", c.c, got, c.want)
		}
	}
	// The last failed attempt of a request was not followed by another: no fallback.
	if n := testutil.CollectAndCount(m.fallbacks); n != 2 {
		t.Errorf("%d fallback series, want 2", n)
	}
	if n := testutil.CollectAndCount(m.redactions); n != 1 {
		t.Errorf("%d redaction series, want 1 (PHONE was not redacted)", n)
	}
}

// TestPolicyReloadOutcomes: a new revision is loaded, a failure keeps the
// old one serving (unhealthy), the content coming back is restored.
func TestPolicyReloadOutcomes(t *testing.T) {
	m := NewMetrics()
	at := time.Unix(1700000000, 0)
	for _, c := range []struct {
		st      policies.Status
		prev    string
		want    string
		healthy float64
	}{
		{policies.Status{Revision: "b", Healthy: true, LoadedAt: at}, "a", "loaded", 1},
		{policies.Status{Revision: "b", Healthy: false, LastError: "parse error", LoadedAt: at}, "b", "failed", 0},
		{policies.Status{Revision: "b", Healthy: true, LoadedAt: at}, "b", "restored", 1},
	} {
		if got := m.PolicyReload(c.st, c.prev); got != c.want || testutil.ToFloat64(m.healthy) != c.healthy {
			t.Fatalf("%+v after %s: %s healthy %v, want %s %v", c.st, c.prev, got, testutil.ToFloat64(m.healthy), c.want, c.healthy)
		}
	}
	if got := testutil.ToFloat64(m.loaded); got != 1700000000 {
		t.Fatalf("loaded timestamp %v", got)
	}
}

// TestStateTrackerSeesTransitions: registration, warm to hot, removal.
func TestStateTrackerSeesTransitions(t *testing.T) {
	var tr StateTracker
	steps := []struct {
		in   []Adapter
		want []Transition
	}{
		{[]Adapter{{Name: "b", State: "cold"}, {Name: "a", State: "warm"}}, []Transition{{"a", "", "warm"}, {"b", "", "cold"}}},
		{[]Adapter{{Name: "a", State: "hot"}, {Name: "b", State: "cold"}}, []Transition{{"a", "warm", "hot"}}},
		{[]Adapter{{Name: "a", State: "hot"}}, []Transition{{"b", "cold", ""}}},
		{[]Adapter{{Name: "a", State: "hot"}}, nil},
	}
	for i, s := range steps {
		got := tr.Observe(s.in)
		if len(got) != len(s.want) {
			t.Fatalf("step %d: %v, want %v", i, got, s.want)
		}
		for j := range got {
			if got[j] != s.want[j] {
				t.Fatalf("step %d: %v, want %v", i, got, s.want)
			}
		}
	}
}
