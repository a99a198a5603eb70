package meter

import (
	"math"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/molly-gateway/molly/redaction"
	"github.com/molly-gateway/molly/router/classify"
	"github.com/molly-gateway/molly/router/openai"
	"github.com/molly-gateway/molly/router/route"
)

func testAnnotation(tb testing.TB) *classify.Annotation {
	tb.Helper()
	sc, err := redaction.NewScanner(redaction.Config{})
	if err != nil {
		tb.Fatal(err)
	}
	a, err := classify.New(sc, nil).Classify(classify.Input{Endpoint: openai.EndpointChat,
		Body: []byte(`{"model":"chat","messages":[{"role":"user","content":"Say hello."}]}`)})
	if err != nil {
		tb.Fatal(err)
	}
	return a
}

// series is the value of the one series of family name with labels (a
// counter's value, a histogram's count and sum), and whether it exists.
func series(t *testing.T, reg *prometheus.Registry, name string, labels map[string]string) (v, sum float64, ok bool) {
	t.Helper()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
	next:
		for _, m := range f.GetMetric() {
			if len(m.GetLabel()) != len(labels) {
				continue
			}
			for _, l := range m.GetLabel() {
				if labels[l.GetName()] != l.GetValue() {
					continue next
				}
			}
			return value(m)
		}
	}
	return 0, 0, false
}

func value(m *dto.Metric) (float64, float64, bool) {
	if c := m.GetCounter(); c != nil {
		return c.GetValue(), 0, true
	}
	return float64(m.GetHistogram().GetSampleCount()), m.GetHistogram().GetSampleSum(), true
}

// TestServedSeries: each answer Served counts lands in the series of its
// own labels, and the token and cost series appear only once an answer
// with token counts came (as with a label look-up per answer); the
// figures are written by hand.
func TestServedSeries(t *testing.T) {
	m, reg := NewMetrics(), prometheus.NewRegistry()
	if err := m.Register(reg); err != nil {
		t.Fatal(err)
	}
	a := testAnnotation(t)
	lan := route.Candidate{Target: &route.Target{Name: "lan", Tier: "T1", PriceIn: 1, PriceOut: 2}}
	cloud := route.Candidate{Target: &route.Target{Name: "cloud", Tier: "T3"}}
	req := func(target, tier, decision string) map[string]string {
		return map[string]string{"tier": tier, "target": target, "adapter": "", "category": a.Task(), "decision": decision}
	}
	tokens := func(typ string) map[string]string {
		return map[string]string{"gen_ai_operation_name": "chat", "gen_ai_request_model": "chat", "gen_ai_token_type": typ,
			"tier": "T1", "target": "lan", "adapter": "", "category": a.Task()}
	}

	m.Served(a, lan, "routed", 0.5, 0.1, -1, -1)
	if v, _, _ := series(t, reg, "molly_requests_total", req("lan", "T1", "routed")); v != 1 {
		t.Errorf("requests = %v, want 1", v)
	}
	if _, _, ok := series(t, reg, "gen_ai_client_token_usage", tokens("input")); ok {
		t.Error("a token series exists before any answer had token counts")
	}
	if _, _, ok := series(t, reg, "molly_cost_usd_total", map[string]string{"tier": "T1", "target": "lan", "adapter": "", "category": a.Task()}); ok {
		t.Error("a cost series exists before any answer had token counts")
	}

	m.Served(a, lan, "routed", 0.25, 0.1, 10, 5)
	m.Served(a, lan, "routed", 0.25, 0.1, 20, -1)
	m.Served(a, lan, "fallback", 1, 0.2, 1, 1)
	m.Served(a, cloud, "routed", 1, 0.2, 1, 1)
	for _, c := range []struct {
		labels map[string]string
		want   float64
	}{{req("lan", "T1", "routed"), 3}, {req("lan", "T1", "fallback"), 1}, {req("cloud", "T3", "routed"), 1}} {
		if v, _, _ := series(t, reg, "molly_requests_total", c.labels); v != c.want {
			t.Errorf("requests %v = %v, want %v", c.labels, v, c.want)
		}
	}
	if n, sum, _ := series(t, reg, "gen_ai_client_token_usage", tokens("input")); n != 3 || sum != 31 {
		t.Errorf("input tokens: %v observations of sum %v, want 3 of 31", n, sum)
	}
	if n, sum, _ := series(t, reg, "gen_ai_client_token_usage", tokens("output")); n != 2 || sum != 6 {
		t.Errorf("output tokens: %v observations of sum %v, want 2 of 6", n, sum)
	}
	dur := map[string]string{"gen_ai_operation_name": "chat", "gen_ai_request_model": "chat", "tier": "T1", "target": "lan",
		"adapter": "", "category": a.Task(), "decision": "routed"}
	if n, sum, _ := series(t, reg, "gen_ai_client_operation_duration_seconds", dur); n != 3 || sum != 1 {
		t.Errorf("durations: %v of sum %v, want 3 of 1", n, sum)
	}
	if n, _, _ := series(t, reg, "molly_time_to_first_byte_seconds", map[string]string{"tier": "T1", "target": "lan"}); n != 4 {
		t.Errorf("time to first byte: %v observations, want 4", n)
	}
	// (10·1 + 5·2) + 20·1 + (1·1 + 1·2) = 43 tokens·USD per 1M tokens.
	if v, _, _ := series(t, reg, "molly_cost_usd_total", map[string]string{"tier": "T1", "target": "lan", "adapter": "", "category": a.Task()}); math.Abs(v-43e-6) > 1e-15 {
		t.Errorf("cost = %v, want 43e-6", v)
	}
}

// BenchmarkServed measures counting one answer, by a label look-up in
// each vector per call ("labels", as Served did before) and by Served's
// collectors cached per label tuple ("cached"), in the same run.
func BenchmarkServed(b *testing.B) {
	m := NewMetrics()
	a := testAnnotation(b)
	c := route.Candidate{Target: &route.Target{Name: "lan", Tier: "T1", PriceIn: 1, PriceOut: 2}}
	b.Run("labels", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			servedByLabels(m, a, c, "routed", 0.01, 0.001, 512, 24)
		}
	})
	b.Run("cached", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			m.Served(a, c, "routed", 0.01, 0.001, 512, 24)
		}
	})
}

// servedByLabels is Served as it was before its collectors were cached.
func servedByLabels(m *Metrics, a *classify.Annotation, c route.Candidate, decision string, seconds, ttfb float64, prompt, completion int) {
	t, ad, op := c.Target, c.Adapter(), a.Endpoint().Operation()
	m.requests.WithLabelValues(t.Tier, t.Name, ad, a.Task(), decision).Inc()
	m.duration.WithLabelValues(op, a.Model(), t.Tier, t.Name, ad, a.Task(), decision).Observe(seconds)
	m.ttfb.WithLabelValues(t.Tier, t.Name).Observe(ttfb)
	if prompt >= 0 {
		m.tokens.WithLabelValues(op, a.Model(), "input", t.Tier, t.Name, ad, a.Task()).Observe(float64(prompt))
	}
	if completion >= 0 {
		m.tokens.WithLabelValues(op, a.Model(), "output", t.Tier, t.Name, ad, a.Task()).Observe(float64(completion))
	}
	if prompt >= 0 || completion >= 0 {
		m.cost.WithLabelValues(t.Tier, t.Name, ad, a.Task()).Add(t.Cost(max(prompt, 0), max(completion, 0)))
	}
}
