package pipeline

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"math"
	"net/http"
	"reflect"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/molly-gateway/molly/internal/policytest"
	"github.com/molly-gateway/molly/internal/upstreamtest"
	"github.com/molly-gateway/molly/policies"
	"github.com/molly-gateway/molly/router/classify"
	"github.com/molly-gateway/molly/router/identity"
	"github.com/molly-gateway/molly/router/meter"
	"github.com/molly-gateway/molly/router/openai"
	"github.com/molly-gateway/molly/router/route"
)

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
	core, logs := observer.New(zapcore.InfoLevel)
	priors, metrics, reg := route.NewPriors(), meter.NewMetrics(), prometheus.NewRegistry()
	if err := metrics.Register(reg); err != nil {
		t.Fatal(err)
	}
	srv, _ := startGateway(t, setup{
		targets: []*route.Target{
			{Name: "lan", Tier: "T1", Endpoint: lan.URL(), Models: []string{"m"}, LatencyMS: 1000, Quality: map[string]float64{"default": 0.7}},
			{Name: "cloud", Tier: "T3", Endpoint: cloud.URL(), Models: []string{"m=gpt-m"}, PriceIn: 5, PriceOut: 15, LatencyMS: 500,
				Quality: map[string]float64{"default": 0.9}},
		},
		policy: policytest.Literal(t, policytest.Allow([]string{"T0", "T1", "T2", "T3"}, nil, nil)), // a decision, and its id, per request
		edit:   func(p *Pipeline) { p.Logger, p.Priors, p.Metrics = zap.New(core), priors, metrics },
	})
	// 23 runes of content → 6 + 3 + 3 = 12 prompt tokens; max_tokens 500:
	// cloud costs (12·5 + 500·15)/1e6 = 0.00756 USD → 0.9 − 0.0756 − 0.025 = 0.7994; lan 0.7 − 0.05 = 0.65.
	body := `{"model":"m","max_tokens":500,"messages":[{"role":"user","content":"hello there, my friend!"}]}`

	resp := postChat(t, srv.URL, body, nil)
	if got, want := resp.Header.Get(HeaderRoute), "cloud/gpt-m score=0.7994; runner-up lan/m score=0.6500"; got != want {
		t.Fatalf("X-Molly-Route = %q, want %q", got, want)
	}
	id := resp.Header.Get(HeaderDecisionID)

	t.Run("the decision log names candidates with their terms, the plan and its reservation", func(t *testing.T) {
		entries := logs.FilterMessage("route decision").All()
		if len(entries) != 1 {
			t.Fatalf("%d route decision lines", len(entries))
		}
		f := entries[0].ContextMap()
		want := []any{"cloud/gpt-m q=0.9000 (config) cost=0.007560 lat=0.500 score=0.7994", "lan/m q=0.7000 (config) cost=0.000000 lat=1.000 score=0.6500"}
		if got := f["candidates"]; !reflect.DeepEqual(got, want) || f["task"] != "chat" || f["decision_id"] != id || f["strategy"] != "single" {
			t.Fatalf("log fields %v", f)
		}
		// One answer at cloud's prices, the costlier candidate: the prompt at
		// its bound (the body's bytes, one request's and one message's
		// allowance) and 500 completion tokens.
		prompt := len(body) + classify.BoundPerRequest + classify.BoundPerMessage
		if wantUSD := float64(prompt*5+500*15) / 1e6; f["reserve_tokens"] != int64(prompt+500) || math.Abs(f["reserve_usd"].(float64)-wantUSD) > 1e-12 {
			t.Fatalf("reservation %v tokens, %v USD; want %d, %v", f["reserve_tokens"], f["reserve_usd"], prompt+500, wantUSD)
		}
	})

	t.Run("the request moved the counters", func(t *testing.T) {
		if got := metricValue(t, reg, "molly_requests_total", map[string]string{"tier": "T3", "target": "cloud", "adapter": "", "category": "chat", "decision": "routed"}); got != 1 {
			t.Fatalf("molly_requests_total = %v, want 1", got)
		}
		// upstreamtest reports 5 prompt and 5 completion tokens: 5·5 + 5·15 = 100 µUSD.
		if got := metricValue(t, reg, "molly_cost_usd_total", map[string]string{"tier": "T3", "target": "cloud", "adapter": "", "category": "chat"}); got != 100e-6 {
			t.Fatalf("molly_cost_usd_total = %v, want 0.0001", got)
		}
		if n := seriesOf(t, reg, "gen_ai_client_token_usage"); n != 2 {
			t.Fatalf("%d token usage series, want input and output", n)
		}
		if n := seriesOf(t, reg, "gen_ai_client_operation_duration_seconds"); n != 1 {
			t.Fatalf("%d duration series, want 1", n)
		}
		if got := metricValue(t, reg, "molly_time_to_first_byte_seconds", map[string]string{"tier": "T3", "target": "cloud"}); got != 1 {
			t.Fatalf("%v time-to-first-byte samples, want 1", got)
		}
	})

	t.Run("the decision is remembered for feedback, and feedback changes the next decision", func(t *testing.T) {
		res, err := priors.Feedback(id, 0)
		if err != nil || res.Key != (route.PriorKey{Target: "cloud", Model: "gpt-m", Category: "chat"}) {
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
		want := "lan/m score=0.7000; runner-up none; excluded cloud: expected cost 0.00756 USD over X-Molly-Max-Cost 0.001"
		if got := resp.Header.Get(HeaderTarget); got != "lan" || resp.Header.Get(HeaderRoute) != want {
			t.Fatalf("target %q route %q, want %q", got, resp.Header.Get(HeaderRoute), want)
		}
		last := logs.FilterMessage("route decision").All()
		f := last[len(last)-1].ContextMap()
		if !reflect.DeepEqual(f["excluded"], []any{"cloud: expected cost 0.00756 USD over X-Molly-Max-Cost 0.001"}) || f["prefer"] != "best" || f["max_cost_usd"] != 0.001 {
			t.Fatalf("log fields %v", f)
		}
	})

	t.Run("a stream that broke off is counted as truncated and takes no feedback", func(t *testing.T) {
		// prefer best: lan (0.7) over cloud, whose prior three bad scores brought to 0.6561.
		resp := postChat(t, srv.URL, `{"model":"m","stream":true,"messages":[{"role":"user","content":"TRUNCATE please"}]}`, map[string]string{"X-Molly-Prefer": "best"})
		if got := metricValue(t, reg, "molly_requests_total", map[string]string{"tier": "T1", "target": "lan", "adapter": "", "category": "chat", "decision": "truncated"}); got != 1 {
			t.Fatalf("truncated count %v (target %s)", got, resp.Header.Get(HeaderTarget))
		}
		if _, err := priors.Feedback(resp.Header.Get(HeaderDecisionID), 1); !errors.Is(err, route.ErrUnknownDecision) {
			t.Fatalf("feedback on a truncated answer: %v, want ErrUnknownDecision", err)
		}
	})

	t.Run("a bad override header is a 400 that names it and is counted", func(t *testing.T) {
		resp := postChat(t, srv.URL, body, map[string]string{"X-Molly-Prefer": "fastest"})
		if resp.StatusCode != 400 {
			t.Fatalf("status %d", resp.StatusCode)
		}
		if got := metricValue(t, reg, "molly_requests_total", map[string]string{"tier": "", "target": "", "adapter": "", "category": "chat", "decision": "bad_request"}); got != 1 {
			t.Fatalf("bad_request count %v", got)
		}
	})

	t.Run("an unknown model is counted as not found", func(t *testing.T) {
		if resp := postChat(t, srv.URL, `{"model":"nope","messages":[{"role":"user","content":"hi"}]}`, nil); resp.StatusCode != 404 {
			t.Fatalf("status %d", resp.StatusCode)
		}
		if got := metricValue(t, reg, "molly_requests_total", map[string]string{"tier": "", "target": "", "adapter": "", "category": "chat", "decision": "model_not_found"}); got != 1 {
			t.Fatalf("model_not_found count %v", got)
		}
	})
}

// TestDecideSendsTheInputDocument: the policy sees the annotation, the
// caller and the catalogue's targets in the shape policies/README.md
// gives, and no request text.
func TestDecideSendsTheInputDocument(t *testing.T) {
	dir := t.TempDir()
	src := "package molly.policy\n\nimport rego.v1\n\ndecision := {\"allow\": true, \"tiers\": [\"T1\"], \"reasons\": [json.marshal(input)]}\n"
	if err := writeFile(dir, "echo.rego", src); err != nil {
		t.Fatal(err)
	}
	eng, err := policies.New(context.Background(), policies.Options{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	_, p := startGateway(t, setup{policy: eng, targets: []*route.Target{
		{Name: "lan", Tier: "T1", Endpoint: "http://127.0.0.1:1/v1", Models: []string{"m"}, PriceIn: 1, PriceOut: 2},
	}})
	a := mustClassify(t, openai.EndpointChat, `{"model":"m","max_tokens":9,"messages":[{"role":"user","content":"mail alice@example.com"}]}`)
	id := &identity.Identity{Member: "alice", Tiers: []string{"T1"}, Budgeted: true, RemainingUSD: 2.5}
	d := p.Decide(context.Background(), a, id)
	var got map[string]any
	if err := json.Unmarshal([]byte(d.Decision().Reasons()[0]), &got); err != nil {
		t.Fatal(err)
	}
	delete(got["capability"].(map[string]any), "difficulty") // the estimator's value, asserted in router/capability
	// "mail alice@example.com" 6 tokens + 6.
	want := map[string]any{
		"request": map[string]any{"endpoint": "chat.completions", "model": "m", "stream": false, "tools": []any{}, "choices": 1.0,
			"api": "", "stored_conversation": false},
		"capability": map[string]any{"task": "chat", "modalities": []any{"text"}, "prompt_tokens": 12.0, "max_tokens": 9.0, "tools": false},
		"sovereignty": map[string]any{"sensitivity": "internal", "detected": "internal", "declared": "public", "findings": map[string]any{"EMAIL": 1.0},
			"opaque": false, "unscanned": []any{}, "scan_failed": false, "residency": ""},
		"identity": map[string]any{"member": "alice", "scopes": []any{"tier:T1"}, "models": []any{}, "tiers": []any{"T1"}, "tools": []any{}, "remaining_usd": 2.5},
		"targets":  []any{map[string]any{"name": "lan", "tier": "T1", "kind": "openai", "region": "local", "models": []any{"m"}, "price_in": 1.0, "price_out": 2.0}},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("input =\n%v\nwant\n%v", got, want)
	}
	if strings.Contains(d.Decision().Reasons()[0], "alice@example.com") {
		t.Fatal("the input document carries request text")
	}
	if !d.Binds(a) || d.Digest() != a.Digest() {
		t.Fatal("the decision is not bound to the annotation it judged")
	}
}

// TestDefaultPolicyTiersByClass: the default policy, end to end with the
// classifier: the class (detected, declared, opaque) decides the tiers.
func TestDefaultPolicyTiersByClass(t *testing.T) {
	_, p := startGateway(t, setup{targets: []*route.Target{{Name: "lan", Tier: "T1", Endpoint: "http://127.0.0.1:1/v1", Models: []string{"m"}}}})
	tests := []struct {
		name, ep, body string
		want           []string
		class          string
		redactT3       []string
	}{
		{"public reaches every tier and redacts nothing", "chat", chatBody("hello"), []string{"T0", "T1", "T2", "T3"}, "public", []string{}},
		{"internal stops at T2", "chat", chatBody("alice@example.com"), []string{"T0", "T1", "T2"}, "internal", nil},
		{"confidential stays on T0 and T1", "chat", chatBody("4111 1111 1111 1111"), []string{"T0", "T1"}, "confidential", nil},
		{"restricted stays on T0", "chat", chatBody("sk-proj-abcdefghijklmnopqrstuvwxyzABCDEF0123456789abcd"), []string{"T0"}, "restricted", nil},
		{"token ids are opaque, treated as confidential", "completions", `{"model":"m","prompt":[1,2]}`, []string{"T0", "T1"}, "confidential", nil},
		{"a binary image is opaque, treated as confidential", "chat",
			`{"model":"m","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"data:image/png;base64,AAAA"}}]}]}`, []string{"T0", "T1"}, "confidential", nil},
	}
	t.Run("a key scoped to tiers narrows the class's tiers", func(t *testing.T) {
		d := p.Decide(context.Background(), mustClassify(t, openai.EndpointChat, chatBody("hello")), &identity.Identity{Member: "a", Tiers: []string{"T0", "T1"}}).Decision()
		if !d.Allowed() || !reflect.DeepEqual(d.Tiers(), []string{"T0", "T1"}) {
			t.Fatalf("tiers %v (%v), want T0,T1", d.Tiers(), d.Reasons())
		}
	})
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ep := openai.EndpointChat
			if tt.ep == "completions" {
				ep = openai.EndpointCompletions
			}
			d := p.Decide(context.Background(), mustClassify(t, ep, tt.body), nil).Decision()
			if !d.Allowed() || !reflect.DeepEqual(d.Tiers(), tt.want) || d.Sensitivity() != tt.class || !reflect.DeepEqual(d.Redact("T3"), tt.redactT3) {
				t.Fatalf("decision tiers %v, class %q, redact T3 %v, reasons %v; want %v, %s, %v", d.Tiers(), d.Sensitivity(), d.Redact("T3"), d.Reasons(), tt.want, tt.class, tt.redactT3)
			}
		})
	}
}

func TestDecidedContext(t *testing.T) {
	if _, ok := DecidedFrom(context.Background()); ok {
		t.Fatal("a decision in a bare context")
	}
	a := mustClassify(t, openai.EndpointChat, chatBody("hi"))
	d := policytest.Decide(t, policytest.Default(t), a)
	got, ok := DecidedFrom(WithDecided(context.Background(), d))
	if !ok || got.Decision() != d.Decision() || !got.Binds(a) {
		t.Fatal("WithDecided/DecidedFrom do not round-trip")
	}
}
