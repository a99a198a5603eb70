package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/molly-gateway/molly/internal/upstreamtest"
	"github.com/molly-gateway/molly/policies"
	"github.com/molly-gateway/molly/serving"
)

// scrape returns Molly's /metrics text.
func scrape(t *testing.T, base string) string {
	t.Helper()
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

// sample is the value of the series name{labels} in a /metrics text (the
// exposition format writes labels sorted by name), and whether it is there.
func sample(text, name string, labels map[string]string) (float64, bool) {
	keys := make([]string, 0, len(labels))
	for k := range labels {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	b.WriteString(name)
	if len(keys) > 0 {
		b.WriteByte('{')
		for i, k := range keys {
			if i > 0 {
				b.WriteByte(',')
			}
			fmt.Fprintf(&b, "%s=%q", k, labels[k])
		}
		b.WriteByte('}')
	}
	prefix := b.String() + " "
	for _, line := range strings.Split(text, "\n") {
		if v, ok := strings.CutPrefix(line, prefix); ok {
			f, err := strconv.ParseFloat(v, 64)
			return f, err == nil
		}
	}
	return 0, false
}

// TestMetricsCountWhatClientsSaw drives one of each event the metrics
// count — authentication failures, a denial, rate refusals at admission
// and at the plan's reservation, a
// cascade that escalates past a failing target to a redacting tier, policy
// reloads that load, fail and come back — and checks each counter against
// what the clients were answered; then checks that every metric the
// Grafana dashboard in examples/ queries is in /metrics.
func TestMetricsCountWhatClientsSaw(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: starts Molly with the engine")
	}
	lan, ext := upstreamtest.Start("lan"), upstreamtest.Start("ext")
	t.Cleanup(func() { lan.Close(); ext.Close() })
	lan.Logprob, ext.Logprob = -3, -0.1 // the cascade's threshold is -1: lan's answer is escalated
	models := t.TempDir()
	if err := serving.WriteDemo(models, 1, "tiny"); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	err := fs.WalkDir(policies.Default, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || strings.HasSuffix(p, "_test.rego") {
			return err
		}
		b, err := policies.Default.ReadFile(p)
		if err == nil {
			err = os.WriteFile(filepath.Join(dir, p), b, 0o644)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	admin := adminSocket(t)
	g := startMolly(t, `{
	admin `+admin+`|0600
	auto_https off
	persist_config off
	molly {
		registry `+filepath.Join(t.TempDir(), "molly.db")+`
		policy_dir `+dir+`
		cascade {
			threshold -1
		}
		engine {
			model `+filepath.Join(models, serving.DemoModelFile)+`
			adapters `+filepath.Join(models, serving.DemoAdapterDir)+`
			n_seq_max 2
			n_ctx 1024
			threads 1
		}
		target device {
			tier T0
			kind engine
			models local=molly-demo
		}
		target lan {
			tier T1
			endpoint `+lan.URL()+`
			models chat=small-lan
			quality 0.5
		}
		target broken {
			tier T2
			endpoint http://127.0.0.1:1/v1
			models chat=big
			price 0.01 0.01
			quality 0.9
		}
		target external {
			tier T3
			endpoint `+ext.URL()+`
			models chat=gpt-4o-mini
			price 0.15 0.6
			quality 0.95
		}
	}
}
http://127.0.0.1:{PORT} {
	handle /metrics {
		metrics
	}
	handle {
		molly_auth
		molly_classify {
			sensitivity EMAIL public
		}
		molly_policy
		molly_route
	}
}
`)
	base := strings.TrimSuffix(g.URL, "/v1")
	for _, m := range []map[string]any{{"name": "alice"}, {"name": "bob", "models": []string{"other-model"}},
		{"name": "carol", "rpm": 1}, {"name": "dave", "tpm": 20}} {
		if code, body := adminCall(t, admin, http.MethodPost, "/molly/members", m); code != http.StatusCreated {
			t.Fatalf("member %v: %d %s", m["name"], code, body)
		}
	}
	keys := map[string]string{}
	for _, m := range []string{"alice", "bob", "carol", "dave"} {
		keys[m], _ = newKey(t, admin, m)
	}
	ctx := context.Background()
	status := func(err error) (int, string) {
		if err == nil {
			return 200, ""
		}
		e := apiError(t, err)
		return e.StatusCode, e.Code
	}

	// Authentication failures.
	req, _ := http.NewRequest(http.MethodPost, g.URL+"/chat/completions", strings.NewReader(`{"model":"chat","messages":[{"role":"user","content":"hi"}]}`))
	resp, err := http.DefaultClient.Do(req)
	if err != nil || resp.StatusCode != 401 {
		t.Fatalf("no key: %v %v", err, resp)
	}
	resp.Body.Close()
	if code, _ := status(func() error {
		_, err := keyClient(g, "sk-molly-not-a-real-key").Chat.Completions.New(ctx, chat("hi"))
		return err
	}()); code != 401 {
		t.Fatalf("bad key: %d", code)
	}
	// A denial, by the key's model scope.
	if code, c := status(func() error { _, err := keyClient(g, keys["bob"]).Chat.Completions.New(ctx, chat("hi")); return err }()); code != 403 || c != "model_not_allowed" {
		t.Fatalf("bob: %d %s", code, c)
	}
	// A rate refusal at admission (1 request per minute), on the engine's own model.
	local := openai.ChatCompletionNewParams{Model: "local", MaxTokens: openai.Int(2), Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")}}
	for i, want := range []int{200, 429} {
		if code, _ := status(func() error { _, err := keyClient(g, keys["carol"]).Chat.Completions.New(ctx, local); return err }()); code != want {
			t.Fatalf("carol's request %d: %d, want %d", i+1, code, want)
		}
	}
	// A rate refusal at the plan's reservation: its worst case (prompt plus
	// the whole completion budget) is over the 20 tokens a minute.
	if code, c := status(func() error { _, err := keyClient(g, keys["dave"]).Chat.Completions.New(ctx, chat("hi")); return err }()); code != 429 || c != "rate_limit_exceeded" {
		t.Fatalf("dave: %d %s", code, c)
	}
	// A cascade: lan's answer is too weak, broken cannot be reached, the external API answers with the address redacted.
	var cresp *http.Response
	if _, err := keyClient(g, keys["alice"]).Chat.Completions.New(ctx, chat("Please write to jane.doe@example.com about the meeting"), option.WithResponseInto(&cresp)); err != nil {
		t.Fatal(err)
	}
	if cresp.Header.Get("X-Molly-Tier") != "T3" || !strings.HasPrefix(cresp.Header.Get("X-Molly-Cascade"), "lan/small-lan logprob=-3.00<-1.00 -> broken/big failed -> external/gpt-4o-mini") ||
		ext.Contains("jane.doe@example.com") || !lan.Contains("jane.doe@example.com") {
		t.Fatalf("cascade: tier %s, steps %q", cresp.Header.Get("X-Molly-Tier"), cresp.Header.Get("X-Molly-Cascade"))
	}

	text := scrape(t, base)
	for _, c := range []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		// startMolly's readiness probe (GET /v1/models without a key) is the other one.
		{"molly_auth_failures_total", map[string]string{"reason": "missing_key"}, 2},
		{"molly_auth_failures_total", map[string]string{"reason": "invalid_key"}, 1},
		{"molly_denials_total", map[string]string{"code": "model_not_allowed"}, 1},
		{"molly_refusals_total", map[string]string{"reason": "rate_requests", "stage": "admission"}, 1},
		{"molly_refusals_total", map[string]string{"reason": "rate_tokens", "stage": "reservation"}, 1},
		{"molly_refusals_total", map[string]string{"reason": "rate_tokens", "stage": "admission"}, 0},
		{"molly_refusals_total", map[string]string{"reason": "budget", "stage": "admission"}, 0},
		{"molly_cascade_escalations_total", map[string]string{"from_tier": "T1", "to_tier": "T3"}, 1},
		{"molly_fallbacks_total", map[string]string{"failure": "connect", "tier": "T2", "target": "broken"}, 1},
		{"molly_redactions_total", map[string]string{"type": "EMAIL", "tier": "T3"}, 1},
		{"molly_outcomes_total", map[string]string{"gen_ai_request_model": "chat", "gen_ai_operation_name": "chat", "tier": "T3", "outcome": "escalated"}, 1},
		{"molly_outcomes_total", map[string]string{"gen_ai_request_model": "local", "gen_ai_operation_name": "chat", "tier": "T0", "outcome": "routed"}, 1},
		{"molly_outcomes_total", map[string]string{"gen_ai_request_model": "chat", "gen_ai_operation_name": "chat", "tier": "", "outcome": "denied"}, 1},
		{"molly_policy_healthy", nil, 1},
		{"molly_engine_queue_depth", nil, 0},
		{"molly_engine_running_sequences", nil, 0},
		{"molly_engine_kv_slots_used_ratio", nil, 0},
		{"molly_engine_adapters", map[string]string{"state": "hot"}, 0},
		{"molly_engine_adapters", map[string]string{"state": "warm"}, float64(len(serving.DemoAdapters))},
		{"molly_engine_adapter_transitions_total", map[string]string{"from": "", "to": "warm"}, float64(len(serving.DemoAdapters))},
	} {
		if got, ok := sample(text, c.name, c.labels); !ok || got != c.want {
			t.Errorf("%s%v = %v (present %v), want %v", c.name, c.labels, got, ok, c.want)
		}
	}
	if steps, ok := sample(text, "molly_engine_steps_total", nil); !ok || steps < 1 {
		t.Errorf("molly_engine_steps_total = %v after carol's engine answer", steps)
	}
	if got, ok := sample(text, "gen_ai_client_token_usage_count", map[string]string{"adapter": "", "category": "chat", "gen_ai_operation_name": "chat",
		"gen_ai_request_model": "chat", "gen_ai_token_type": "input", "target": "external", "tier": "T3"}); !ok || got != 1 {
		t.Errorf("gen_ai_client_token_usage_count for the external answer = %v (present %v)", got, ok)
	}

	// Policy reloads: a new revision, a broken one (the last good keeps
	// serving), then the good content back.
	residency := filepath.Join(dir, "residency.rego")
	orig, err := os.ReadFile(residency)
	if err != nil {
		t.Fatal(err)
	}
	waitFor := func(name string, labels map[string]string, want float64) {
		t.Helper()
		deadline := time.Now().Add(15 * time.Second)
		for {
			if got, _ := sample(scrape(t, base), name, labels); got == want {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s%v never reached %v", name, labels, want)
			}
			time.Sleep(50 * time.Millisecond) // between polls of the condition
		}
	}
	steps := []struct {
		content string
		outcome string
		healthy float64
	}{
		{string(orig) + "\n# an edit\n", "loaded", 1},
		{"package molly.policy\nthis is not rego\n", "failed", 0},
		{string(orig) + "\n# an edit\n", "restored", 1},
	}
	for _, s := range steps {
		if err := os.WriteFile(residency, []byte(s.content), 0o644); err != nil {
			t.Fatal(err)
		}
		waitFor("molly_policy_reloads_total", map[string]string{"outcome": s.outcome}, 1)
		waitFor("molly_policy_healthy", nil, s.healthy)
	}

	// Every metric the dashboard queries is exported.
	text = scrape(t, base)
	for _, name := range dashboardMetrics(t, filepath.Join(repoRoot, "examples", "grafana", "molly-dashboard.json")) {
		if !strings.Contains(text, "# TYPE "+name+" ") {
			t.Errorf("the dashboard queries %s, which /metrics does not have", name)
		}
	}
}

// dashboardMetrics returns the metric names the Grafana dashboard's
// queries use (histogram series named by their family), from every
// panel's targets[].expr; label names (in by(...) and {...}) are not
// metrics.
func dashboardMetrics(t *testing.T, path string) []string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Panels []json.RawMessage `json:"panels"`
	}
	if err := json.Unmarshal(b, &dash); err != nil {
		t.Fatalf("%s is not valid JSON: %v", path, err)
	}
	type panel struct {
		Title   string            `json:"title"`
		Panels  []json.RawMessage `json:"panels"`
		Targets []struct {
			Expr string `json:"expr"`
		} `json:"targets"`
	}
	grouping := regexp.MustCompile(`\b(?:by|without)\s*\([^)]*\)|\{[^}]*\}`)
	ident := regexp.MustCompile(`\b(?:molly|gen_ai)_[a-z0-9_]+\b`)
	seen := map[string]bool{}
	var walk func([]json.RawMessage)
	exprs := 0
	walk = func(ps []json.RawMessage) {
		for _, raw := range ps {
			var p panel
			if err := json.Unmarshal(raw, &p); err != nil {
				t.Fatalf("panel: %v", err)
			}
			walk(p.Panels)
			for _, tg := range p.Targets {
				exprs++
				for _, name := range ident.FindAllString(grouping.ReplaceAllString(tg.Expr, " "), -1) {
					for _, suf := range []string{"_bucket", "_sum", "_count"} {
						if n, ok := strings.CutSuffix(name, suf); ok && strings.HasPrefix(n, "gen_ai_client_") || ok && n == "molly_time_to_first_byte_seconds" {
							name = n
						}
					}
					seen[name] = true
				}
			}
		}
	}
	walk(dash.Panels)
	if exprs < 20 || len(seen) < 20 {
		t.Fatalf("the dashboard has %d queries over %d metrics; a dashboard of the metrics has more", exprs, len(seen))
	}
	out := make([]string, 0, len(seen))
	for n := range seen {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}
