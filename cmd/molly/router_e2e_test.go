package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/molly-gateway/molly/serving"
)

// routerCaddyfile is the three tiers' Caddyfile with feedback and metrics
// routes beside the gateway's.
func routerCaddyfile(tr *tiers, extraGlobal string) string {
	cf := tr.caddyfile(extraGlobal, "")
	site := strings.Index(cf, "http://127.0.0.1:{PORT} {")
	return cf[:site] + `http://127.0.0.1:{PORT} {
	handle /v1/feedback {
		molly_feedback
	}
	handle /metrics {
		metrics
	}
	handle {
		molly_classify
		molly_policy
		molly_route
	}
}
`
}

// feedback posts body to /v1/feedback and returns the status and the decoded answer.
func feedback(t *testing.T, g *gateway, body string) (int, map[string]any) {
	t.Helper()
	resp, err := http.Post(g.URL+"/feedback", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		t.Fatalf("feedback answer: %v", err)
	}
	return resp.StatusCode, out
}

// ask sends a chat request and returns the answer's routing headers.
func ask(t *testing.T, g *gateway, prompt string, opts ...option.RequestOption) http.Header {
	t.Helper()
	var resp *http.Response
	_, err := client(g).Chat.Completions.New(context.Background(), chat(prompt), append(opts, option.WithResponseInto(&resp))...)
	if err != nil {
		t.Fatal(err)
	}
	return resp.Header
}

// TestFeedbackMovesPriorsAndRestartKeepsThem: explicit feedback lowers the
// chosen target's prior until another wins; a new process on the same
// registry (where the priors live) decides the same way.
func TestFeedbackMovesPriorsAndRestartKeepsThem(t *testing.T) {
	tr := startTiers(t)
	db := filepath.Join(t.TempDir(), "molly.db")
	cfg := routerCaddyfile(tr, "registry "+db)
	g := startMolly(t, cfg)
	const prompt = "Write a haiku about autumn" // creative, public: every tier

	h := ask(t, g, prompt)
	if h.Get("X-Molly-Target") != "external" || !strings.HasPrefix(h.Get("X-Molly-Route"), "external/gpt-4o-mini score=0.9") ||
		!strings.Contains(h.Get("X-Molly-Route"), "; runner-up selfhosted/mid-remote score=0.7") {
		t.Fatalf("first answer: target %q, route %q", h.Get("X-Molly-Target"), h.Get("X-Molly-Route"))
	}
	id := h.Get("X-Molly-Decision-Id")

	t.Run("a score is folded into the prior of the target, model and category that answered", func(t *testing.T) {
		status, out := feedback(t, g, `{"decision_id":"`+id+`","score":0}`)
		want := map[string]any{"object": "feedback", "decision_id": id, "target": "external", "model": "gpt-4o-mini",
			"category": "creative", "quality": 0.855, "observations": 1.0} // 0.9·0.95 + 0.1·0
		if status != 200 || fmt.Sprint(out) != fmt.Sprint(want) {
			t.Fatalf("feedback: %d %v\nwant 200 %v", status, out, want)
		}
	})
	t.Run("a second score for one decision is a 409", func(t *testing.T) {
		status, out := feedback(t, g, `{"decision_id":"`+id+`","score":1}`)
		if status != 409 || errCode(out) != "feedback_already_given" {
			t.Fatalf("%d %v", status, out)
		}
	})
	t.Run("an unknown decision id is a 404 OpenAI error", func(t *testing.T) {
		status, out := feedback(t, g, `{"decision_id":"00000000-0000-0000-0000-000000000000","score":1}`)
		e, _ := out["error"].(map[string]any)
		if status != 404 || errCode(out) != "decision_not_found" || e["param"] != "decision_id" || e["type"] != "invalid_request_error" {
			t.Fatalf("%d %v", status, out)
		}
	})
	t.Run("a GET is a 405", func(t *testing.T) {
		resp, err := http.Get(g.URL + "/feedback")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 405 {
			t.Fatalf("status %d", resp.StatusCode)
		}
	})
	t.Run("a score outside 0..1 is a 400 naming score", func(t *testing.T) {
		status, out := feedback(t, g, `{"decision_id":"`+id+`","score":1.5}`)
		if e, _ := out["error"].(map[string]any); status != 400 || e["param"] != "score" {
			t.Fatalf("%d %v", status, out)
		}
	})
	t.Run("a body over the limit is a 413, one with a key twice or invalid UTF-8 a 400", func(t *testing.T) {
		big := `{"decision_id":"` + strings.Repeat("a", 70000) + `","score":1}`
		if status, out := feedback(t, g, big); status != 413 || errCode(out) != "request_too_large" {
			t.Fatalf("a body of %d bytes: %d %v", len(big), status, out)
		}
		for _, b := range []string{`{"decision_id":"` + id + `","score":1,"score":0}`, "{\"decision_id\":\"\xff\",\"score\":1}"} {
			status, out := feedback(t, g, b)
			if e, _ := out["error"].(map[string]any); status != 400 || e["type"] != "invalid_request_error" {
				t.Fatalf("%q: %d %v", b, status, out)
			}
		}
	})

	// Two more bad scores: 0.95·0.9³ = 0.69255 puts external (minus ≈ 0.002 of cost and
	// its learned latency, a few ms) below selfhosted (0.75 − 0.0016 − 0.05·0.4 ≈ 0.728).
	for i := 0; i < 2; i++ {
		h := ask(t, g, prompt)
		if h.Get("X-Molly-Target") != "external" {
			t.Fatalf("answer %d went to %s before its prior fell", i+2, h.Get("X-Molly-Target"))
		}
		if status, out := feedback(t, g, `{"decision_id":"`+h.Get("X-Molly-Decision-Id")+`","score":0}`); status != 200 {
			t.Fatalf("feedback %d: %d %v", i+2, status, out)
		}
	}
	h = ask(t, g, prompt)
	if h.Get("X-Molly-Target") != "selfhosted" || !strings.Contains(h.Get("X-Molly-Route"), "; runner-up external/gpt-4o-mini score=0.6") {
		t.Fatalf("after three bad scores: target %q, route %q", h.Get("X-Molly-Target"), h.Get("X-Molly-Route"))
	}
	learned := regexp.MustCompile(`external/gpt-4o-mini q=0\.692\d \(learned 3\)`)
	if !g.waitLogs(learned) {
		t.Fatalf("the decision log lacks the learned prior:\n%s", g.logs.String())
	}

	// kill -9 and start again on the same file: feedback was committed before it was acknowledged.
	_ = g.cmd.Process.Kill()
	_ = g.cmd.Wait()
	g = startMolly(t, cfg)
	h = ask(t, g, prompt)
	if h.Get("X-Molly-Target") != "selfhosted" || !strings.Contains(h.Get("X-Molly-Route"), "; runner-up external/gpt-4o-mini score=0.6") {
		t.Fatalf("after a restart: target %q, route %q", h.Get("X-Molly-Target"), h.Get("X-Molly-Route"))
	}
	if !g.waitLogs(learned) {
		t.Fatalf("the restarted decision log lacks the learned prior:\n%s", g.logs.String())
	}
}

func errCode(out map[string]any) any {
	e, _ := out["error"].(map[string]any)
	return e["code"]
}

// TestOverridesAndMetrics: X-Molly-Max-Cost and X-Molly-Prefer steer the
// choice, and /metrics counts requests, tokens, cost and durations.
func TestOverridesAndMetrics(t *testing.T) {
	tr := startTiers(t)
	g := startMolly(t, routerCaddyfile(tr, ""))
	const prompt = "Translate to English: domani piove"

	if h := ask(t, g, prompt); h.Get("X-Molly-Target") != "external" {
		t.Fatalf("without overrides: %s", h.Get("X-Molly-Target"))
	}
	if h := ask(t, g, prompt, option.WithHeader("X-Molly-Max-Cost", "0")); h.Get("X-Molly-Target") != "lan" ||
		!strings.Contains(h.Get("X-Molly-Route"), "; runner-up none; excluded selfhosted: expected cost 0.000157 USD over X-Molly-Max-Cost 0") {
		t.Fatalf("max cost 0: target %s, route %q", h.Get("X-Molly-Target"), h.Get("X-Molly-Route"))
	}
	// With 10000 completion tokens external costs ≈ 0.006 USD: 0.95 − 10·0.006 still wins by
	// default, but prefer cheap weighs a dollar 100 points (0.95 − 0.6) and the free lan wins
	// (0.6 less 0.05 × its learned latency, under a few ms).
	long := chat(prompt)
	long.MaxTokens = openai.Int(10000)
	var resp *http.Response
	if _, err := client(g).Chat.Completions.New(context.Background(), long, option.WithHeader("X-Molly-Prefer", "cheap"), option.WithResponseInto(&resp)); err != nil ||
		resp.Header.Get("X-Molly-Target") != "lan" || !regexp.MustCompile(`^lan/small-lan score=0\.(599\d|6000); runner-up external/gpt-4o-mini score=0\.3`).MatchString(resp.Header.Get("X-Molly-Route")) {
		t.Fatalf("prefer cheap: %v, route %q", err, resp.Header.Get("X-Molly-Route"))
	}
	_, err := client(g).Chat.Completions.New(context.Background(), chat(prompt), option.WithHeader("X-Molly-Prefer", "fastest"))
	var apiErr *openai.Error
	if !asAPIError(err, &apiErr) || apiErr.StatusCode != 400 || apiErr.Param != "X-Molly-Prefer" {
		t.Fatalf("a bad X-Molly-Prefer: %v", err)
	}
	if !g.waitLogs(regexp.MustCompile(`"msg":"route decision".*"excluded":\["selfhosted: expected cost [0-9.]+ USD over X-Molly-Max-Cost 0","external: expected cost`)) {
		t.Fatalf("no decision log line with the exclusions:\n%s", g.logs.String())
	}

	resp, err = http.Get(strings.TrimSuffix(g.URL, "/v1") + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	text := string(b)
	for _, want := range []string{
		`molly_requests_total{adapter="",category="translation",decision="routed",target="external",tier="T3"} 1`,
		`molly_requests_total{adapter="",category="translation",decision="routed",target="lan",tier="T1"} 2`,
		`molly_requests_total{adapter="",category="translation",decision="bad_request",target="",tier=""} 1`,
		// upstreamtest reports 5 prompt and 5 completion tokens per answer.
		`gen_ai_client_token_usage_sum{adapter="",category="translation",gen_ai_operation_name="chat",gen_ai_request_model="chat",gen_ai_token_type="input",target="external",tier="T3"} 5`,
		`gen_ai_client_token_usage_count{adapter="",category="translation",gen_ai_operation_name="chat",gen_ai_request_model="chat",gen_ai_token_type="output",target="lan",tier="T1"} 2`,
		// external: (5·0.15 + 5·0.6)/1e6 USD; lan is free.
		`molly_cost_usd_total{adapter="",category="translation",target="external",tier="T3"} 3.75e-06`,
		`molly_cost_usd_total{adapter="",category="translation",target="lan",tier="T1"} 0`,
		`gen_ai_client_operation_duration_seconds_count{adapter="",category="translation",decision="routed",gen_ai_operation_name="chat",gen_ai_request_model="chat",target="lan",tier="T1"} 2`,
		`molly_time_to_first_byte_seconds_count{target="external",tier="T3"} 1`,
	} {
		if !strings.Contains(text, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	if t.Failed() {
		t.Logf("/metrics:\n%s", text)
	}
}

func asAPIError(err error, target **openai.Error) bool {
	e, ok := err.(*openai.Error)
	if ok {
		*target = e
	}
	return ok
}

// TestAdapterOutranksAnUnadaptedTarget: a billing question on a generic
// model name goes to the T0 engine's billing adapter, whose prior is strong.
func TestAdapterOutranksAnUnadaptedTarget(t *testing.T) {
	tr := startTiers(t)
	models := t.TempDir()
	if err := serving.WriteDemo(models, 1, "tiny"); err != nil {
		t.Fatal(err)
	}
	g := startMolly(t, routerCaddyfile(tr, `engine {
			model `+filepath.Join(models, serving.DemoModelFile)+`
			adapters `+filepath.Join(models, serving.DemoAdapterDir)+`
			n_seq_max 2
			n_ctx 1024
			threads 1
		}
		target device {
			tier T0
			kind engine
			models chat=molly-demo
			latency 50ms
			quality 0.3
			quality billing 0.97
		}`))
	var resp *http.Response
	out, err := client(g).Chat.Completions.New(context.Background(), openai.ChatCompletionNewParams{Model: "chat", MaxTokens: openai.Int(4),
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("I was charged twice on my last invoice")}},
		option.WithResponseInto(&resp))
	if err != nil {
		t.Fatal(err)
	}
	// device/molly-demo:billing: 0.97 − 0.05·0.05 = 0.9675 beats external's
	// 0.95 − 10·(16·0.15 + 4·0.6)/1e6 − 0.05·0.8 = 0.90995.
	// The answer names the model the client asked for; the route says which adapter answered.
	if route := resp.Header.Get("X-Molly-Route"); resp.Header.Get("X-Molly-Target") != "device" || out.Model != "chat" ||
		!strings.HasPrefix(route, "device/molly-demo:billing score=0.9675; runner-up external/gpt-4o-mini score=0.9100") {
		t.Fatalf("target %q model %q route %q", resp.Header.Get("X-Molly-Target"), out.Model, route)
	}
	// A question outside the adapters' domains stays with the objective's choice.
	h := ask(t, g, "Write a haiku about autumn")
	if h.Get("X-Molly-Target") != "external" || !g.waitLogs(regexp.MustCompile(regexp.QuoteMeta(`"device/molly-demo q=0.3000 (config)`))) {
		t.Fatalf("haiku: target %q route %q", h.Get("X-Molly-Target"), h.Get("X-Molly-Route"))
	}
}
