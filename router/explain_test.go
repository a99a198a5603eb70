package router

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/molly-gateway/molly/api"
	"github.com/molly-gateway/molly/internal/upstreamtest"
	"github.com/molly-gateway/molly/policies"
)

// routedGateway serves classify → decision (every tier) → Forwarder.Serve
// with priors and metrics, logging into an observer.
func routedGateway(t *testing.T, targets []*Target) (*httptest.Server, *Priors, *Metrics, *observer.ObservedLogs) {
	t.Helper()
	cat := newCatalogue(t, targets...)
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "echo.rego"), []byte(echoPolicy), 0o600); err != nil {
		t.Fatal(err)
	}
	eng, err := policies.New(context.Background(), policies.Options{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	every := map[string]any{"decision": decisionMap([]string{"T0", "T1", "T2", "T3"}, nil)}
	core, logs := observer.New(zapcore.InfoLevel)
	f := &Forwarder{Catalogue: cat, Weights: DefaultWeights, Logger: zap.New(core), Priors: NewPriors(), Metrics: NewMetrics()}
	cls := testClassifier(t)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ep, _ := EndpointOf(r.Method, r.URL.Path)
		body, _ := io.ReadAll(r.Body)
		a, err := cls.Classify(ep, body, "", "")
		if err != nil {
			api.WriteError(w, err)
			return
		}
		d := eng.DecideMap(r.Context(), every) // a decision, and its id, per request
		if err := f.Serve(w, r, a, d); err != nil {
			api.WriteError(w, err)
		}
	}))
	t.Cleanup(srv.Close)
	return srv, f.Priors, f.Metrics, logs
}

func postChat(t *testing.T, url, body string, headers map[string]string) *http.Response {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, url+"/v1/chat/completions", strings.NewReader(body))
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	_, _ = io.ReadAll(resp.Body)
	return resp
}

func TestServeExplainsLearnsAndCounts(t *testing.T) {
	lan, cloud := upstreamtest.Start("lan"), upstreamtest.Start("cloud")
	t.Cleanup(func() { lan.Close(); cloud.Close() })
	srv, priors, m, logs := routedGateway(t, []*Target{
		{Name: "lan", Tier: "T1", Endpoint: lan.URL(), Models: []string{"m"}, LatencyMS: 1000, Quality: map[string]float64{"default": 0.7}},
		{Name: "cloud", Tier: "T3", Endpoint: cloud.URL(), Models: []string{"m=gpt-m"}, PriceIn: 5, PriceOut: 15, LatencyMS: 500,
			Quality: map[string]float64{"default": 0.9}},
	})
	// 24 runes of content → 6 + 3 + 3 = 12 prompt tokens; max_tokens 500:
	// cloud costs (12·5 + 500·15)/1e6 = 0.00756 USD → 0.9 − 0.0756 − 0.025 = 0.7994; lan 0.7 − 0.05 = 0.65.
	body := `{"model":"m","max_tokens":500,"messages":[{"role":"user","content":"hello there, my friend!"}]}`

	resp := postChat(t, srv.URL, body, nil)
	if got, want := resp.Header.Get(HeaderRoute), "cloud/gpt-m score=0.7994; runner-up lan/m score=0.6500"; got != want {
		t.Fatalf("X-Molly-Route = %q, want %q", got, want)
	}
	id := resp.Header.Get(HeaderDecisionID)

	t.Run("the decision log names candidates with their terms and the exclusions", func(t *testing.T) {
		entries := logs.FilterMessage("route decision").All()
		if len(entries) != 1 {
			t.Fatalf("%d route decision lines", len(entries))
		}
		f := entries[0].ContextMap()
		want := []any{"cloud/gpt-m q=0.9000 (config) cost=0.007560 lat=0.500 score=0.7994", "lan/m q=0.7000 (config) cost=0.000000 lat=1.000 score=0.6500"}
		if got := f["candidates"]; !equalAny(got, want) || f["task"] != "chat" || f["decision_id"] != id {
			t.Fatalf("log fields %v", f)
		}
	})

	t.Run("the request moved the counters", func(t *testing.T) {
		if got := counterValue(t, m.requests.WithLabelValues("T3", "cloud", "", "chat", "routed")); got != 1 {
			t.Fatalf("molly_requests_total = %v, want 1", got)
		}
		// upstreamtest reports 5 prompt and 5 completion tokens: 5·5 + 5·15 = 100 µUSD.
		if got := counterValue(t, m.cost.WithLabelValues("T3", "cloud", "", "chat")); got != 100e-6 {
			t.Fatalf("molly_cost_usd_total = %v, want 0.0001", got)
		}
		if n := series(m.tokens); n != 2 {
			t.Fatalf("%d token usage series, want input and output", n)
		}
		if n := series(m.duration); n != 1 {
			t.Fatalf("%d duration series, want 1", n)
		}
	})

	t.Run("the decision is remembered for feedback, and feedback changes the next decision", func(t *testing.T) {
		res, err := priors.Feedback(id, 0)
		if err != nil || res.Key != (PriorKey{"cloud", "gpt-m", "chat"}) {
			t.Fatalf("Feedback = %+v, %v", res, err)
		}
		for range 2 { // 0.9 → 0.81 → 0.729 → 0.6561
			next := postChat(t, srv.URL, body, nil)
			if next.Header.Get(HeaderTarget) != "cloud" {
				t.Fatalf("routed to %s before the third bad score", next.Header.Get(HeaderTarget))
			}
			if _, err := priors.Feedback(next.Header.Get(HeaderDecisionID), 0); err != nil {
				t.Fatal(err)
			}
		}
		// cloud: 0.6561 − 0.0756 − 0.05·(its learned latency, a few ms) ≈ 0.580; lan keeps 0.65.
		resp := postChat(t, srv.URL, body, nil)
		if got, want := resp.Header.Get(HeaderRoute), "lan/m score=0.6500; runner-up cloud/gpt-m score=0.580"; !strings.HasPrefix(got, want) {
			t.Fatalf("after three bad scores X-Molly-Route = %q, want %q…", got, want)
		}
	})

	t.Run("the learned latency replaced the static prior", func(t *testing.T) {
		if l, ok := priors.Latency("cloud", false); !ok || l <= 0 || l > 5 {
			t.Fatalf("cloud latency %v, %v", l, ok)
		}
	})

	t.Run("X-Molly-Max-Cost excludes the costly target; X-Molly-Prefer best re-weights", func(t *testing.T) {
		resp := postChat(t, srv.URL, body, map[string]string{"X-Molly-Max-Cost": "0.001", "X-Molly-Prefer": "best"})
		if got := resp.Header.Get(HeaderTarget); got != "lan" || !strings.HasPrefix(resp.Header.Get(HeaderRoute), "lan/m score=0.7000; runner-up none") {
			t.Fatalf("target %q route %q", got, resp.Header.Get(HeaderRoute))
		}
		last := logs.FilterMessage("route decision").All()
		f := last[len(last)-1].ContextMap()
		if !equalAny(f["excluded"], []any{"cloud: expected cost 0.007560 USD over X-Molly-Max-Cost 0.001000"}) || f["prefer"] != "best" {
			t.Fatalf("log fields %v", f)
		}
	})

	t.Run("a stream that broke off is counted as truncated and takes no feedback", func(t *testing.T) {
		// prefer best: lan (0.7) over cloud, whose prior three bad scores brought to 0.6561.
		resp := postChat(t, srv.URL, `{"model":"m","stream":true,"messages":[{"role":"user","content":"TRUNCATE please"}]}`, map[string]string{"X-Molly-Prefer": "best"})
		if got := counterValue(t, m.requests.WithLabelValues("T1", "lan", "", "chat", "truncated")); got != 1 {
			t.Fatalf("truncated count %v (target %s)", got, resp.Header.Get(HeaderTarget))
		}
		if _, err := priors.Feedback(resp.Header.Get(HeaderDecisionID), 1); err != ErrUnknownDecision {
			t.Fatalf("feedback on a truncated answer: %v, want ErrUnknownDecision", err)
		}
	})

	t.Run("a bad override header is a 400 that names it and is counted", func(t *testing.T) {
		resp := postChat(t, srv.URL, body, map[string]string{"X-Molly-Prefer": "fastest"})
		if resp.StatusCode != 400 {
			t.Fatalf("status %d", resp.StatusCode)
		}
		if got := counterValue(t, m.requests.WithLabelValues("", "", "", "chat", "bad_request")); got != 1 {
			t.Fatalf("bad_request count %v", got)
		}
	})
}

func equalAny(got any, want []any) bool {
	g, ok := got.([]any)
	if !ok || len(g) != len(want) {
		return false
	}
	for i := range g {
		if g[i] != want[i] {
			return false
		}
	}
	return true
}

func counterValue(t *testing.T, c prometheus.Counter) float64 {
	t.Helper()
	var out dto.Metric
	if err := c.Write(&out); err != nil {
		t.Fatal(err)
	}
	return out.GetCounter().GetValue()
}

// series counts the label sets a collector holds.
func series(c prometheus.Collector) int {
	ch := make(chan prometheus.Metric, 64)
	c.Collect(ch)
	close(ch)
	return len(ch)
}
