package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/tidwall/gjson"

	"github.com/molly-gateway/molly/internal/upstreamtest"
	"github.com/molly-gateway/molly/policies"
	"github.com/molly-gateway/molly/serving"
)

// tiers are three upstreams standing for T1 (LAN), T2 (self-hosted) and T3 (external).
type tiers struct{ t1, t2, t3 *upstreamtest.Upstream }

func startTiers(t *testing.T) *tiers {
	tr := &tiers{upstreamtest.Start("t1"), upstreamtest.Start("t2"), upstreamtest.Start("t3")}
	t.Cleanup(func() { tr.t1.Close(); tr.t2.Close(); tr.t3.Close() })
	return tr
}

// caddyfile declares the three targets. With the default weights, a public
// chat request prefers t3 (quality 0.95), then t2, then t1.
func (tr *tiers) caddyfile(extraGlobal, classify string) string {
	return `{
	admin off
	auto_https off
	persist_config off
	molly {
		` + extraGlobal + `
		target lan {
			tier T1
			endpoint ` + tr.t1.URL() + `
			models chat=small-lan text-embedding-3-small
			price 0 0
			latency 300ms
			quality 0.6
		}
		target selfhosted {
			tier T2
			endpoint ` + tr.t2.URL() + `
			models chat=mid-remote
			price 0.2 0.6
			latency 400ms
			quality 0.75
		}
		target external {
			tier T3
			endpoint ` + tr.t3.URL() + `
			models chat=gpt-4o-mini gpt-4o-mini
			api_key_env MOLLY_TEST_T3_KEY
			price 0.15 0.6
			latency 800ms
			quality 0.95
		}
	}
}
http://127.0.0.1:{PORT} {
	molly_classify {
		max_body_size 64KiB
		` + classify + `
	}
	molly_policy
	molly_route
}
`
}

func client(g *gateway) *openai.Client {
	c := openai.NewClient(option.WithBaseURL(g.URL), option.WithAPIKey("sk-client-key-not-forwarded"), option.WithMaxRetries(0))
	return &c
}

func chat(text string) openai.ChatCompletionNewParams {
	return openai.ChatCompletionNewParams{Model: "chat", Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage(text)}}
}

func TestGatewayRoutesBySensitivity(t *testing.T) {
	tr := startTiers(t)
	g := startMolly(t, tr.caddyfile("", ""))
	c := client(g)
	ctx := context.Background()

	cases := []struct {
		name, prompt, wantTarget, wantTier string
		secret                             string // must never reach t3
	}{
		{"a public prompt goes to the target the objective prefers", "Write a haiku about autumn", "external", "T3", ""},
		{"an email keeps the prompt off external APIs", "Reply to mario.rossi@example.com about the invoice", "selfhosted", "T2", "mario.rossi@example.com"},
		{"a card number keeps the prompt on the LAN", "My card is 4111 1111 1111 1111, is it valid?", "lan", "T1", "4111 1111 1111 1111"},
		{"an IBAN keeps the prompt on the LAN", "Pay to IT60X0542811101000000123456 today", "lan", "T1", "IT60X0542811101000000123456"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var resp *http.Response
			out, err := c.Chat.Completions.New(ctx, chat(tc.prompt), option.WithResponseInto(&resp))
			if err != nil {
				t.Fatal(err)
			}
			if got := resp.Header.Get("X-Molly-Target"); got != tc.wantTarget {
				t.Fatalf("X-Molly-Target = %q, want %q", got, tc.wantTarget)
			}
			if got := resp.Header.Get("X-Molly-Tier"); got != tc.wantTier {
				t.Fatalf("X-Molly-Tier = %q, want %q", got, tc.wantTier)
			}
			if id := resp.Header.Get("X-Molly-Decision-Id"); len(id) != 36 {
				t.Fatalf("X-Molly-Decision-Id = %q, want a UUID", id)
			}
			want := map[string]string{"external": "t3", "selfhosted": "t2", "lan": "t1"}[tc.wantTarget] + " says: " + tc.prompt
			if got := out.Choices[0].Message.Content; got != want {
				t.Fatalf("answer %q, want %q", got, want)
			}
			if tc.secret != "" && tr.t3.Contains(tc.secret) {
				t.Fatalf("T3 received %q", tc.secret)
			}
		})
	}
	// The client's key is Molly's business; upstreams see their own key only.
	for _, h := range tr.t3.Headers() {
		if h.Get("Authorization") != "Bearer "+t3Key {
			t.Fatalf("T3 got Authorization %q", h.Get("Authorization"))
		}
	}
	for _, h := range append(tr.t1.Headers(), tr.t2.Headers()...) {
		if h.Get("Authorization") != "" {
			t.Fatalf("a non-T3 upstream got Authorization %q", h.Get("Authorization"))
		}
	}
	// The upstream got its own model name (alias resolved).
	if b := tr.t2.Received(); len(b) == 0 || !strings.Contains(string(b[0]), `"model":"mid-remote"`) {
		t.Fatalf("T2 did not receive the aliased model: %s", b)
	}
	// Decision log lines carry ids, never prompt text or keys.
	// Log lines are written off the request path (internal/asynclog).
	g.waitLogs(regexp.MustCompile(`"msg":"policy decision".*"decision_id"`))
	logs := g.logs.String()
	if !strings.Contains(logs, `"decision_id"`) || !strings.Contains(logs, `"msg":"policy decision"`) {
		t.Fatalf("no decision log line in:\n%s", logs)
	}
	for _, secret := range []string{"mario.rossi@example.com", "4111 1111 1111 1111", "haiku", t3Key, "sk-client-key"} {
		if strings.Contains(logs, secret) {
			t.Fatalf("logs contain %q", secret)
		}
	}
}

func TestGatewayRedactsForT3AndRestoresTheAnswer(t *testing.T) {
	tr := startTiers(t)
	// Declared rule: e-mail addresses are public here, so T3 is allowed, but
	// the policy still requires them redacted for T3.
	g := startMolly(t, tr.caddyfile("", "sensitivity EMAIL public"))
	c := client(g)
	prompt := "Draft a reply to anna@example.org and cc anna@example.org"
	var resp *http.Response
	out, err := c.Chat.Completions.New(context.Background(), chat(prompt), option.WithResponseInto(&resp))
	if err != nil {
		t.Fatal(err)
	}
	if resp.Header.Get("X-Molly-Tier") != "T3" {
		t.Fatalf("tier %q, want T3", resp.Header.Get("X-Molly-Tier"))
	}
	if tr.t3.Count() != 1 || tr.t3.Contains("anna@example.org") {
		t.Fatalf("T3 must get the prompt redacted: %s", tr.t3.Received())
	}
	if got, want := out.Choices[0].Message.Content, "t3 says: "+prompt; got != want {
		t.Fatalf("restored answer %q, want %q", got, want)
	}

	// Streaming: the echoed placeholders are cut across many chunks, and
	// still come back as the original values.
	for _, chunks := range []int{3, 17, 40} {
		tr.t3.Chunks = chunks
		stream := c.Chat.Completions.NewStreaming(context.Background(), chat(prompt))
		var text strings.Builder
		n := 0
		for stream.Next() {
			for _, ch := range stream.Current().Choices {
				text.WriteString(ch.Delta.Content)
				n++
			}
		}
		if err := stream.Err(); err != nil {
			t.Fatal(err)
		}
		if got, want := text.String(), "t3 says: "+prompt; got != want || n < 2 {
			t.Fatalf("%d chunks: streamed %q in %d chunks, want %q", chunks, got, n, want)
		}
	}
	if tr.t3.Contains("anna@example.org") {
		t.Fatal("T3 received the address")
	}
}

func TestGatewayFallsBackWithinAllowedTiers(t *testing.T) {
	tr := startTiers(t)
	g := startMolly(t, tr.caddyfile("", ""))
	c := client(g)
	ctx := context.Background()

	tr.t3.Close() // the preferred upstream dies
	var resp *http.Response
	if _, err := c.Chat.Completions.New(ctx, chat("Tell me a joke"), option.WithResponseInto(&resp)); err != nil {
		t.Fatal(err)
	}
	if got := resp.Header.Get("X-Molly-Target"); got != "selfhosted" {
		t.Fatalf("public request fell back to %q, want selfhosted", got)
	}

	// A 5xx before the first byte also falls back.
	if _, err := c.Chat.Completions.New(ctx, chat("FAIL500 please"), option.WithResponseInto(&resp)); err == nil {
		t.Fatal("every target answers 500 to FAIL500; want an error")
	} else {
		var apiErr *openai.Error
		if !errors.As(err, &apiErr) || apiErr.StatusCode != 503 || !strings.Contains(apiErr.Message, "selfhosted: HTTP 500") || !strings.Contains(apiErr.Message, "lan: HTTP 500") {
			t.Fatalf("want 503 listing the failed attempts, got %v", err)
		}
	}

	// A confidential request whose only allowed targets are down gets 503
	// and never reaches T2.
	tr.t1.Close()
	before := tr.t2.Count()
	_, err := c.Chat.Completions.New(ctx, chat("card 4111111111111111"))
	var apiErr *openai.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("want 503, got %v", err)
	}
	if tr.t2.Count() != before {
		t.Fatal("a confidential request reached T2")
	}
}

// TestATargetWithoutItsKeyIsNeverSentRequests: a target whose api_key_env
// names a variable that is not set is warned about when the config is
// provisioned (molly run and molly validate: the target and the variable,
// no value), excluded from routing with the reason in X-Molly-Route so
// fallback picks another target, and a model only it serves gets the
// gateway's own error naming the reason — never the upstream's 401 for a
// request sent without a key.
func TestATargetWithoutItsKeyIsNeverSentRequests(t *testing.T) {
	tr := startTiers(t)
	cfg := strings.ReplaceAll(tr.caddyfile("", ""), "MOLLY_TEST_T3_KEY", "MOLLY_TEST_UNSET_KEY")
	warned := regexp.MustCompile(`"level":"warn".*"msg":"target excluded from routing: its API key is not set".*"target":"external","api_key_env":"MOLLY_TEST_UNSET_KEY"`)
	t.Run("molly validate warns and accepts the config", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "Caddyfile")
		if err := os.WriteFile(path, []byte(strings.ReplaceAll(cfg, "{PORT}", "9")), 0o644); err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(mollyBin, "validate", "--config", path, "--adapter", "caddyfile")
		cmd.Env = append(mollyEnv(t), "MOLLY_TEST_UNSET_KEY=") // empty is unset
		out, err := cmd.CombinedOutput()
		if err != nil || !warned.Match(out) || !strings.Contains(string(out), "Valid configuration") {
			t.Fatalf("validate: %v\n%s", err, out)
		}
	})
	admin := adminSocket(t)
	g := startMolly(t, strings.Replace(cfg, "admin off", "admin "+admin+"|0600", 1))
	c := client(g)
	ctx := context.Background()
	if !warned.MatchString(g.logs.String()) {
		t.Fatalf("no warning at start:\n%s", g.logs.String())
	}
	t.Run("molly targets says it is excluded, and why", func(t *testing.T) {
		code, body := adminCall(t, admin, http.MethodGet, "/molly/targets", nil)
		ext := gjson.Get(body, `#(target=="external")`)
		if code != http.StatusOK || ext.Get("excluded").Str != "no API key: api_key_env MOLLY_TEST_UNSET_KEY is not set" ||
			gjson.Get(body, `#(target=="selfhosted").excluded`).Exists() {
			t.Fatalf("GET /molly/targets: %d %s", code, body)
		}
		cmd := exec.Command(mollyBin, "targets", "--address", admin)
		cmd.Env = mollyEnv(t)
		out, err := cmd.CombinedOutput()
		row := regexp.MustCompile(`(?m)^external\s+T3\s+excluded\s+0\s+0\s+-\s+no API key: api_key_env MOLLY_TEST_UNSET_KEY is not set$`)
		if err != nil || !row.Match(out) {
			t.Fatalf("molly targets: %v\n%s", err, out)
		}
	})
	t.Run("a public prompt falls back from T3 to T2, saying why", func(t *testing.T) {
		var resp *http.Response
		out, err := c.Chat.Completions.New(ctx, chat("Write a haiku about autumn"), option.WithResponseInto(&resp))
		if err != nil {
			t.Fatal(err)
		}
		// With its key, external (T3) serves this prompt (TestGatewayRoutesBySensitivity).
		route := resp.Header.Get("X-Molly-Route")
		if resp.Header.Get("X-Molly-Target") != "selfhosted" || out.Choices[0].Message.Content != "t2 says: Write a haiku about autumn" ||
			!strings.Contains(route, "; excluded external: no API key: api_key_env MOLLY_TEST_UNSET_KEY is not set") {
			t.Fatalf("target %q route %q answer %q", resp.Header.Get("X-Molly-Target"), route, out.Choices[0].Message.Content)
		}
	})
	t.Run("a model only T3 serves: the gateway's error, not the upstream's 401", func(t *testing.T) {
		resp, b := do(t, g, "POST", "/v1/chat/completions", `{"model":"gpt-4o-mini","messages":[{"role":"user","content":"Hello"}]}`)
		e := gjson.GetBytes(b, "error")
		if resp.StatusCode != http.StatusInternalServerError || e.Get("code").Str != "target_not_configured" || e.Get("type").Str != "server_error" ||
			!strings.Contains(e.Get("message").Str, "external: no API key: api_key_env MOLLY_TEST_UNSET_KEY is not set") ||
			resp.Header.Get("x-should-retry") != "false" || resp.Header.Get("X-Molly-Route") != "none; excluded external: no API key: api_key_env MOLLY_TEST_UNSET_KEY is not set" {
			t.Fatalf("%d %v %s", resp.StatusCode, resp.Header, b)
		}
		// The Messages API says the same in Anthropic's shape.
		resp, b = do(t, g, "POST", "/v1/messages", `{"model":"gpt-4o-mini","max_tokens":5,"messages":[{"role":"user","content":"Hello"}]}`)
		if resp.StatusCode != http.StatusInternalServerError || gjson.GetBytes(b, "type").Str != "error" || gjson.GetBytes(b, "error.type").Str != "api_error" ||
			!strings.Contains(gjson.GetBytes(b, "error.message").Str, "MOLLY_TEST_UNSET_KEY is not set") {
			t.Fatalf("messages: %d %s", resp.StatusCode, b)
		}
	})
	if n := tr.t3.Count(); n != 0 {
		t.Fatalf("the target without its key received %d requests", n)
	}
}

func TestGatewayStreamsIncrementally(t *testing.T) {
	tr := startTiers(t)
	tr.t3.ChunkDelay = 150 * time.Millisecond
	tr.t3.Chunks = 5
	g := startMolly(t, tr.caddyfile("", ""))
	c := client(g)

	start := time.Now()
	stream := c.Chat.Completions.NewStreaming(context.Background(), chat("Count slowly please"))
	var first, last time.Duration
	var text strings.Builder
	var finish string
	for stream.Next() {
		ch := stream.Current()
		if len(ch.Choices) == 0 {
			continue
		}
		if first == 0 {
			first = time.Since(start)
		}
		last = time.Since(start)
		text.WriteString(ch.Choices[0].Delta.Content)
		if ch.Choices[0].FinishReason != "" {
			finish = ch.Choices[0].FinishReason
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	if got, want := text.String(), "t3 says: Count slowly please"; got != want {
		t.Fatalf("streamed %q, want %q", got, want)
	}
	if finish != "stop" {
		t.Fatalf("finish_reason %q, want stop", finish)
	}
	// Five chunks 150 ms apart: unbuffered relaying shows the first one at
	// least 400 ms before the last.
	if last-first < 400*time.Millisecond {
		t.Fatalf("first chunk at %v, last at %v: the stream was buffered", first, last)
	}
}

func TestGatewayReportsTruncatedStreams(t *testing.T) {
	tr := startTiers(t)
	g := startMolly(t, tr.caddyfile("", ""))
	c := client(g)
	stream := c.Chat.Completions.NewStreaming(context.Background(), chat("TRUNCATE this answer into many parts"))
	chunks := 0
	for stream.Next() {
		chunks++
		for _, ch := range stream.Current().Choices {
			if ch.FinishReason != "" {
				t.Fatalf("made-up finish_reason %q", ch.FinishReason)
			}
		}
	}
	err := stream.Err()
	if err == nil || !strings.Contains(err.Error(), "stream_truncated") {
		t.Fatalf("want a stream_truncated error event, got %v after %d chunks", err, chunks)
	}
	if chunks != 2 {
		t.Fatalf("got %d chunks before the error, want the 2 the upstream sent", chunks)
	}
	// Raw view: an error event and no [DONE].
	body := `{"model":"chat","stream":true,"messages":[{"role":"user","content":"TRUNCATE again"}]}`
	resp, err := http.Post(g.URL+"/chat/completions", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(raw), "event: error") || strings.Contains(string(raw), "[DONE]") {
		t.Fatalf("raw stream:\n%s", raw)
	}
}

func TestGatewayRejectsBadInputAndKeepsServing(t *testing.T) {
	tr := startTiers(t)
	g := startMolly(t, tr.caddyfile("", ""))
	big := `{"model":"chat","messages":[{"role":"user","content":"` + strings.Repeat("a", 70<<10) + `"}]}`
	cases := []struct {
		name, method, path, body string
		header                   map[string]string
		status                   int
		errType, param, code     string
		msg                      string
	}{
		{"malformed JSON is a 400", "POST", "/chat/completions", `{"model": "chat", "messages": [`, nil, 400, "invalid_request_error", "", "", "parse the JSON body"},
		{"messages of the wrong type is a 400 naming the field", "POST", "/chat/completions", `{"model":"chat","messages":"hi"}`, nil, 400, "invalid_request_error", "messages", "invalid_type", "expected an array"},
		{"a missing model is a 400", "POST", "/chat/completions", `{"messages":[{"role":"user","content":"hi"}]}`, nil, 400, "invalid_request_error", "model", "", "model parameter"},
		{"a bad role is a 400", "POST", "/chat/completions", `{"model":"chat","messages":[{"role":"wizard","content":"hi"}]}`, nil, 400, "invalid_request_error", "messages[0].role", "invalid_value", "wizard"},
		{"max_tokens must be a positive integer", "POST", "/chat/completions", `{"model":"chat","max_tokens":"ten","messages":[{"role":"user","content":"hi"}]}`, nil, 400, "invalid_request_error", "max_tokens", "invalid_type", "positive integer"},
		{"an unknown model is a 404", "POST", "/chat/completions", `{"model":"gpt-9","messages":[{"role":"user","content":"hi"}]}`, nil, 404, "invalid_request_error", "model", "model_not_found", "gpt-9"},
		{"an oversized body is a 413", "POST", "/chat/completions", big, nil, 413, "invalid_request_error", "", "request_too_large", "limit"},
		{"an unknown URL is a 404", "POST", "/v1/nothing", `{}`, nil, 404, "invalid_request_error", "", "unknown_url", "/v1/nothing"},
		{"a wrong method is a 405", "GET", "/chat/completions", ``, nil, 405, "invalid_request_error", "", "method_not_supported", "POST"},
		{"a bad sensitivity header is a 400", "POST", "/chat/completions", `{"model":"chat","messages":[{"role":"user","content":"hi"}]}`, map[string]string{"X-Molly-Sensitivity": "secret-ish"}, 400, "invalid_request_error", "X-Molly-Sensitivity", "", "unknown sensitivity"},
		{"JSON nested deeper than 64 levels is a 400", "POST", "/chat/completions", `{"model":"chat","messages":[{"role":"user","content":"hi"}],"x":` + strings.Repeat("[", 5000) + strings.Repeat("]", 5000) + `}`, nil, 400, "invalid_request_error", "", "", "deeper than 64"},
		{"invalid UTF-8 is a 400", "POST", "/chat/completions", "{\"model\":\"chat\",\"messages\":[{\"role\":\"user\",\"content\":\"mario@exam\xffple.com\"}]}", nil, 400, "invalid_request_error", "", "", "UTF-8"},
		{"a model name carrying a secret is refused without echo", "POST", "/chat/completions", `{"model":"chat:sk-proj-Zq8xT1vB7nM3kL9pR2sW5yH4dF6gJ0aC1eU8iO7tY3rE2wQ5","messages":[{"role":"user","content":"hi"}]}`, nil, 400, "invalid_request_error", "model", "", "looks like a secret"},
		{"a malformed residency header is a 400", "POST", "/chat/completions", `{"model":"chat","messages":[{"role":"user","content":"hi"}]}`, map[string]string{"X-Molly-Residency": "luigi@example.org"}, 400, "invalid_request_error", "X-Molly-Residency", "", "region code"},
		{"restricted content with no T0 target is a 403 (no retry changes the policy)", "POST", "/chat/completions", `{"model":"chat","messages":[{"role":"user","content":"hi"}]}`, map[string]string{"X-Molly-Sensitivity": "restricted"}, 403, "policy_denied", "", "target_not_allowed", "tier T1 not allowed"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			path := tc.path
			if !strings.HasPrefix(path, "/v1/") {
				path = strings.TrimSuffix(g.URL, "/v1") + "/v1" + path
			} else {
				path = strings.TrimSuffix(g.URL, "/v1") + path
			}
			req, _ := http.NewRequest(tc.method, path, strings.NewReader(tc.body))
			req.Header.Set("Content-Type", "application/json")
			for k, v := range tc.header {
				req.Header.Set(k, v)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			var body struct {
				Error struct {
					Message string  `json:"message"`
					Type    string  `json:"type"`
					Param   *string `json:"param"`
					Code    *string `json:"code"`
				} `json:"error"`
			}
			raw, _ := io.ReadAll(resp.Body)
			if err := json.Unmarshal(raw, &body); err != nil {
				t.Fatalf("status %d, body is not an OpenAI error: %s", resp.StatusCode, raw)
			}
			if resp.StatusCode != tc.status || body.Error.Type != tc.errType || !strings.Contains(body.Error.Message, tc.msg) {
				t.Fatalf("got %d %s, want %d %s containing %q", resp.StatusCode, raw, tc.status, tc.errType, tc.msg)
			}
			if got := deref(body.Error.Param); got != tc.param {
				t.Fatalf("param %q, want %q", got, tc.param)
			}
			if got := deref(body.Error.Code); got != tc.code {
				t.Fatalf("code %q, want %q", got, tc.code)
			}
		})
	}
	// A repeated X-Molly-Sensitivity header cannot lower the class: the
	// highest value wins, so this restricted request finds no T0 target.
	req, _ := http.NewRequest(http.MethodPost, g.URL+"/chat/completions", strings.NewReader(`{"model":"chat","messages":[{"role":"user","content":"top secret plan"}]}`))
	req.Header.Add("X-Molly-Sensitivity", "public")
	req.Header.Add("X-Molly-Sensitivity", "restricted")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden || tr.t3.Contains("top secret plan") {
		t.Fatalf("repeated sensitivity header: status %d, T3 received it: %v", resp.StatusCode, tr.t3.Contains("top secret plan"))
	}
	logs := g.logs.String()
	for _, leaked := range []string{"sk-proj-Zq8xT1vB7nM3kL9pR2sW5yH4dF6gJ0aC1eU8iO7tY3rE2wQ5", "luigi@example.org", "mario@exam"} {
		if strings.Contains(logs, leaked) {
			t.Fatalf("logs contain %q", leaked)
		}
	}
	if !g.alive() {
		t.Fatal("molly died")
	}
	if _, err := client(g).Chat.Completions.New(context.Background(), chat("still there?")); err != nil {
		t.Fatalf("molly stopped serving after bad input: %v", err)
	}
	if tr.t3.Contains(strings.Repeat("a", 1000)) {
		t.Fatal("an oversized body reached an upstream")
	}
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

func TestGatewayOtherEndpoints(t *testing.T) {
	tr := startTiers(t)
	g := startMolly(t, tr.caddyfile("", ""))
	c := client(g)
	ctx := context.Background()

	models, err := c.Models.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, m := range models.Data {
		ids = append(ids, m.ID)
	}
	if strings.Join(ids, ",") != "chat,gpt-4o-mini,text-embedding-3-small" {
		t.Fatalf("models %v, want chat,gpt-4o-mini,text-embedding-3-small (de-duplicated)", ids)
	}
	if m, err := c.Models.Get(ctx, "gpt-4o-mini"); err != nil || m.ID != "gpt-4o-mini" || m.Object != "model" {
		t.Fatalf("retrieving a model: %+v %v", m, err)
	}
	var apiErr *openai.Error
	if _, err := c.Models.Get(ctx, "gpt-9"); !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusNotFound || apiErr.Code != "model_not_found" {
		t.Fatalf("retrieving an unknown model: want 404 model_not_found, got %v", err)
	}
	// gpt-4o-mini lives on T3 only: not reachable for confidential data.
	if _, err := c.Models.Get(ctx, "gpt-4o-mini", option.WithHeader("X-Molly-Sensitivity", "confidential")); !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusNotFound {
		t.Fatalf("retrieving a model out of reach: want 404, got %v", err)
	}

	// Models reachable for a caller who declares confidential data: T0–T1 only.
	models, err = c.Models.List(ctx, option.WithHeader("X-Molly-Sensitivity", "confidential"))
	if err != nil {
		t.Fatal(err)
	}
	ids = ids[:0]
	for _, m := range models.Data {
		ids = append(ids, m.ID)
	}
	if strings.Join(ids, ",") != "chat,text-embedding-3-small" {
		t.Fatalf("confidential models %v", ids)
	}

	emb, err := c.Embeddings.New(ctx, openai.EmbeddingNewParams{Model: "text-embedding-3-small",
		Input: openai.EmbeddingNewParamsInputUnion{OfString: openai.String("call +39 02 1234 5678")}})
	if err != nil {
		t.Fatal(err)
	}
	if len(emb.Data) != 1 || len(emb.Data[0].Embedding) != 3 {
		t.Fatalf("embeddings %+v", emb)
	}

	var resp *http.Response
	cmpl, err := c.Completions.New(ctx, openai.CompletionNewParams{Model: "chat",
		Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String("Once upon a time")}}, option.WithResponseInto(&resp))
	if err != nil {
		t.Fatal(err)
	}
	if cmpl.Choices[0].Text != "t3 says: Once upon a time" || resp.Header.Get("X-Molly-Tier") != "T3" {
		t.Fatalf("completion %q via %s", cmpl.Choices[0].Text, resp.Header.Get("X-Molly-Tier"))
	}
}

func TestPolicyEditsApplyWithoutRestart(t *testing.T) {
	tr := startTiers(t)
	dir := t.TempDir()
	for _, name := range []string{"residency.rego", "redaction.rego"} {
		b, err := policies.Default.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	g := startMolly(t, tr.caddyfile("policy_dir "+dir, ""))
	c := client(g)
	ctx := context.Background()
	if _, err := c.Chat.Completions.New(ctx, chat("hello")); err != nil {
		t.Fatal(err)
	}
	deny := "package molly.policy\nimport rego.v1\ndecision := {\"allow\": false, \"tiers\": [], \"reasons\": [\"maintenance window\"]}\n"
	if err := os.Remove(filepath.Join(dir, "redaction.rego")); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "residency.rego"), []byte(deny), 0o644); err != nil {
		t.Fatal(err)
	}
	// The edit is picked up from file-system events (debounced), not on the
	// request path: ask until the new revision answers, within a deadline.
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, err := c.Chat.Completions.New(ctx, chat("hello again"))
		var apiErr *openai.Error
		if errors.As(err, &apiErr) && apiErr.StatusCode == http.StatusForbidden && strings.Contains(apiErr.RawJSON(), "maintenance window") {
			return
		}
		if err != nil || time.Now().After(deadline) {
			t.Fatalf("want 403 with the policy's reason once the edit is loaded, got %v", err)
		}
		time.Sleep(20 * time.Millisecond) // between polls of the condition, not as synchronisation
	}
}

// TestGatewayWithTheEngineAsT0 runs the real llama.cpp engine in process as
// T0 beside the three upstreams.
func TestGatewayWithTheEngineAsT0(t *testing.T) {
	tr := startTiers(t)
	models := t.TempDir()
	if err := serving.WriteDemo(models, 1, "tiny"); err != nil {
		t.Fatal(err)
	}
	engine := `engine {
			model ` + filepath.Join(models, serving.DemoModelFile) + `
			adapters ` + filepath.Join(models, serving.DemoAdapterDir) + `
			n_seq_max 4
			n_ctx 2048
			threads 1
		}
		target device {
			tier T0
			kind engine
			models chat=molly-demo
			latency 50ms
			quality 0.3
		}`
	g := startMolly(t, tr.caddyfile(engine, ""))
	c := client(g)
	ctx := context.Background()

	// A secret pins the request on the device.
	secret := "sk-proj-Zq8xT1vB7nM3kL9pR2sW5yH4dF6gJ0aC1eU8iO7tY3rE2wQ5"
	var resp *http.Response
	out, err := c.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: "chat", MaxTokens: openai.Int(8),
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("rotate the key " + secret + " please")}},
		option.WithResponseInto(&resp))
	if err != nil {
		t.Fatal(err)
	}
	if resp.Header.Get("X-Molly-Tier") != "T0" || resp.Header.Get("X-Molly-Target") != "device" {
		t.Fatalf("routed to %s/%s, want T0/device", resp.Header.Get("X-Molly-Tier"), resp.Header.Get("X-Molly-Target"))
	}
	if out.Usage.CompletionTokens != 8 || out.Choices[0].FinishReason != "length" || out.Usage.PromptTokens < 10 {
		t.Fatalf("usage %+v finish %q", out.Usage, out.Choices[0].FinishReason)
	}
	for _, u := range []*upstreamtest.Upstream{tr.t1, tr.t2, tr.t3} {
		if u.Contains(secret) {
			t.Fatalf("%s received the secret", u.Name)
		}
	}

	// Adapters are models of their own, listed and routable through the gateway.
	list, err := c.Models.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, m := range list.Data {
		ids = append(ids, m.ID)
	}
	for _, want := range []string{"molly-demo", "molly-demo:support", "molly-demo:legal", "chat"} {
		if !slices.Contains(ids, want) {
			t.Fatalf("models %v lack %s", ids, want)
		}
	}

	// The engine serves embeddings (its Capabilities), through the official client.
	emb, err := c.Embeddings.New(ctx, openai.EmbeddingNewParams{Model: "molly-demo",
		Input: openai.EmbeddingNewParamsInputUnion{OfArrayOfStrings: []string{"hello", "hello"}}})
	if err != nil || len(emb.Data) != 2 || len(emb.Data[0].Embedding) == 0 || !slices.Equal(emb.Data[0].Embedding, emb.Data[1].Embedding) {
		t.Fatalf("embeddings on the engine: %v %+v", err, emb)
	}
	// What the engine cannot serve is excluded with the reason, before any work.
	_, err = c.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: "molly-demo",
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage([]openai.ChatCompletionContentPartUnionParam{
			openai.ImageContentPart(openai.ChatCompletionContentPartImageImageURLParam{URL: "data:image/png;base64,AAAA"})})}})
	var apiErr *openai.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusBadRequest || apiErr.Code != "unsupported_modality" ||
		!strings.Contains(apiErr.Message, "device") {
		t.Fatalf("an image to the text-only engine: want 400 naming the target, got %v", err)
	}
	_, err = c.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: "molly-demo",
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage(strings.Repeat("long ", 12000))}})
	if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusBadRequest || apiErr.Code != "context_length_exceeded" ||
		!strings.Contains(apiErr.Message, "context window 512 tokens") {
		t.Fatalf("a prompt beyond the engine's context: want 400 context_length_exceeded naming the window, got %v", err)
	}

	// Streaming from the engine through the gateway, with usage.
	stream := c.Chat.Completions.NewStreaming(ctx, openai.ChatCompletionNewParams{Model: "molly-demo:support", MaxTokens: openai.Int(6),
		Messages:      []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hello")},
		StreamOptions: openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}})
	var acc openai.ChatCompletionAccumulator
	chunks := 0
	for stream.Next() {
		acc.AddChunk(stream.Current())
		chunks++
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	if acc.Usage.CompletionTokens != 6 || len(acc.Choices) != 1 || acc.Choices[0].FinishReason != "length" || chunks < 3 {
		t.Fatalf("stream: %d chunks, usage %+v, choices %+v", chunks, acc.Usage, acc.Choices)
	}
}

// TestAdminAPIManagesAdaptersAtRunTime adds, refuses and removes LoRA
// adapters through the admin socket while the gateway serves. Uploads are
// read only from the engine's adapter directory: a path outside it (by
// "..", by a symbolic link, or absolute) is refused with the same 403
// whether or not the file exists.
func TestAdminAPIManagesAdaptersAtRunTime(t *testing.T) {
	models, other, dir := t.TempDir(), t.TempDir(), t.TempDir()
	if err := serving.WriteDemo(models, 1, "tiny"); err != nil {
		t.Fatal(err)
	}
	if err := serving.WriteDemo(other, 2, "small"); err != nil { // a different base: its adapters do not fit
		t.Fatal(err)
	}
	// Staged in subfolders of the adapter directory, which the engine's
	// rescan (its *.gguf files) does not pick up by itself.
	for sub, from := range map[string]string{"staged": models, "alien": other} {
		if err := os.CopyFS(filepath.Join(dir, sub), os.DirFS(filepath.Join(from, serving.DemoAdapterDir))); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink(filepath.Join(models, serving.DemoAdapterDir, "billing.gguf"), filepath.Join(dir, "staged", "link.gguf")); err != nil {
		t.Fatal(err)
	}
	admin := adminSocket(t)
	g := startMolly(t, `{
	admin `+admin+`|0600
	auto_https off
	persist_config off
	molly {
		engine {
			model `+filepath.Join(models, serving.DemoModelFile)+`
			adapters `+dir+`
			n_seq_max 2
			n_ctx 1024
			threads 1
		}
		target device {
			tier T0
			kind engine
		}
	}
}
http://127.0.0.1:{PORT} {
	handle /engine/* {
		molly_serve
	}
	handle {
		molly_classify
		molly_policy
		molly_route
	}
}
`)
	c := client(g)
	ctx := context.Background()
	ask := func(model string) error {
		_, err := c.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: model, MaxTokens: openai.Int(2),
			Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")}})
		return err
	}
	post := func(name, path string) (int, string) {
		return adminCall(t, admin, http.MethodPost, "/molly/adapters", map[string]string{"name": name, "path": path})
	}

	var apiErr *openai.Error
	if err := ask("molly-demo:legal"); !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusNotFound {
		t.Fatalf("before adding: want 404, got %v", err)
	}
	legal, err := os.ReadFile(filepath.Join(dir, "staged", "legal.gguf"))
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(legal)
	version := "sha256:" + hex.EncodeToString(sum[:])
	if code, body := post("legal", "staged/legal.gguf"); code != http.StatusCreated || !strings.Contains(body, "molly-demo:legal") || !strings.Contains(body, version) {
		t.Fatalf("add: %d %s, want the model and version %s", code, body, version)
	}
	if code, body := adminCall(t, admin, http.MethodGet, "/molly/engine", nil); code != http.StatusOK || !strings.Contains(body, version) || !strings.Contains(body, `"budget_bytes"`) {
		t.Fatalf("/molly/engine %d %s: want the adapter's version and the memory budget", code, body)
	}
	if err := ask("molly-demo:legal"); err != nil {
		t.Fatalf("after adding: %v", err)
	}
	if code, body := post("alien", filepath.Join(dir, "alien", "legal.gguf")); code != http.StatusUnprocessableEntity || !strings.Contains(body, "refused") {
		t.Fatalf("a mismatched adapter: %d %s", code, body)
	}
	for _, tc := range []struct {
		name, path string
		code       int
	}{
		{"legal", "staged/billing.gguf", http.StatusConflict},
		{"ghost", "staged/nope.gguf", http.StatusBadRequest},
		{"a:b/c", "staged/billing.gguf", http.StatusBadRequest},
		{"..", "staged/billing.gguf", http.StatusBadRequest}, // a path segment: DELETE /molly/adapters/.. could not address it
		{".", "staged/billing.gguf", http.StatusBadRequest},
		{"outside", filepath.Join(models, serving.DemoAdapterDir, "billing.gguf"), http.StatusForbidden},
		{"missing", "/nope.gguf", http.StatusForbidden},
		{"shadow", "/etc/shadow", http.StatusForbidden},
		{"dotdot", "staged/../../" + filepath.Base(models) + "/" + serving.DemoAdapterDir + "/billing.gguf", http.StatusForbidden},
		{"link", "staged/link.gguf", http.StatusForbidden},
	} {
		if code, body := post(tc.name, tc.path); code != tc.code {
			t.Fatalf("adding %q from %s: %d %s, want %d", tc.name, tc.path, code, body, tc.code)
		} else if tc.code == http.StatusForbidden && !strings.Contains(body, "only from the engine's adapter directory") {
			t.Fatalf("adding %q from %s: %s", tc.name, tc.path, body)
		}
	}
	// A field the route does not know is refused, as on the other admin
	// routes, naming it (a typo such as "file" must not be dropped).
	if code, body := adminCall(t, admin, http.MethodPost, "/molly/adapters",
		map[string]string{"name": "typo", "path": "staged/billing.gguf", "file": "staged/billing.gguf"}); code != http.StatusBadRequest || !strings.Contains(body, `unknown field \"file\"`) {
		t.Fatalf("an unknown field: %d %s, want 400 naming \"file\"", code, body)
	}
	if err := ask("molly-demo:alien"); !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusNotFound {
		t.Fatalf("a refused adapter must not be served, got %v", err)
	}
	if code, body := adminCall(t, admin, http.MethodDelete, "/molly/adapters/legal", nil); code != http.StatusNoContent {
		t.Fatalf("delete: %d %s", code, body)
	}
	if err := ask("molly-demo:legal"); !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusNotFound {
		t.Fatalf("after removing: want 404, got %v", err)
	}

	// molly_serve exposes the engine's own OpenAI API.
	direct := openai.NewClient(option.WithBaseURL(strings.TrimSuffix(g.URL, "/v1")+"/engine/v1"), option.WithAPIKey("x"), option.WithMaxRetries(0))
	list, err := direct.Models.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(list.Data) != 1 || list.Data[0].ID != "molly-demo" {
		t.Fatalf("engine models %+v, want just molly-demo", list.Data)
	}
	out, err := direct.Completions.New(ctx, openai.CompletionNewParams{Model: "molly-demo", MaxTokens: openai.Int(3),
		Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String("abc")}})
	if err != nil || out.Usage.CompletionTokens != 3 {
		t.Fatalf("engine completion: %v %+v", err, out)
	}
}
