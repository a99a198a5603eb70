package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/tidwall/gjson"

	"github.com/molly-gateway/molly/router/classify"
)

// authCaddyfile serves one T2 target priced so that each non-streamed
// answer of the test upstream (5 prompt + 5 completion tokens) costs
// exactly 0.0001 USD, behind molly_auth on the registry db (molly_auth's
// db names it again, as the alias it is kept as). molly_auth is written after
// molly_classify on purpose: the directive order must put it first.
func authCaddyfile(tr *tiers, admin, db, extraAuth string) string {
	return `{
	admin ` + admin + `|0600
	auto_https off
	persist_config off
	molly {
		registry ` + db + `
		target selfhosted {
			tier T2
			endpoint ` + tr.t2.URL() + `
			models chat=mid-remote
			price 10 10
		}
	}
}
http://127.0.0.1:{PORT} {
	molly_classify
	molly_auth {
		db ` + db + `
		` + extraAuth + `
	}
	molly_policy
	molly_route
}
`
}

// sentBody is the request body openai-go sends for p: what a recording
// server received from it.
func sentBody(t *testing.T, p openai.ChatCompletionNewParams) []byte {
	t.Helper()
	var got []byte
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got, _ = io.ReadAll(r.Body)
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"id":"x","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,"finish_reason":"stop","logprobs":null,"message":{"role":"assistant","content":"ok","refusal":null}}]}`)
	}))
	defer srv.Close()
	c := openai.NewClient(option.WithBaseURL(srv.URL), option.WithAPIKey("k"), option.WithMaxRetries(0))
	if _, err := c.Chat.Completions.New(context.Background(), p); err != nil || got == nil {
		t.Fatalf("recording the body: %v", err)
	}
	return got
}

// adminCall sends a JSON request to the admin API and returns status and body.
func adminCall(t *testing.T, admin, method, path string, body any) (int, string) {
	t.Helper()
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = strings.NewReader(string(b))
	}
	c, base := adminHTTP(admin)
	req, _ := http.NewRequest(method, base+path, rd)
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// newKey creates a key for member through the admin API.
func newKey(t *testing.T, admin, member string) (key, prefix string) {
	t.Helper()
	code, body := adminCall(t, admin, http.MethodPost, "/molly/keys", map[string]string{"member": member, "name": "test"})
	var out struct{ Key, Prefix string }
	if err := json.Unmarshal([]byte(body), &out); code != http.StatusCreated || err != nil || !strings.HasPrefix(out.Key, "sk-molly-") || !strings.HasPrefix(out.Key, out.Prefix) {
		t.Fatalf("creating a key for %s: %d %s", member, code, body)
	}
	return out.Key, out.Prefix
}

func keyClient(g *gateway, key string) *openai.Client {
	c := openai.NewClient(option.WithBaseURL(g.URL), option.WithAPIKey(key), option.WithMaxRetries(0))
	return &c
}

// apiError returns err as an OpenAI error, failing the test otherwise.
func apiError(t *testing.T, err error) *openai.Error {
	t.Helper()
	var apiErr *openai.Error
	if !errors.As(err, &apiErr) {
		t.Fatalf("want an OpenAI API error, got %v", err)
	}
	return apiErr
}

type usageSummary struct {
	SpentUSD         float64  `json:"spent_usd"`
	RemainingUSD     *float64 `json:"remaining_usd"`
	Requests         int      `json:"requests"`
	PromptTokens     int      `json:"prompt_tokens"`
	CompletionTokens int      `json:"completion_tokens"`
	Recent           []struct {
		DecisionID       string  `json:"decision_id"`
		Target           string  `json:"target"`
		PromptTokens     int     `json:"prompt_tokens"`
		CompletionTokens int     `json:"completion_tokens"`
		Estimated        bool    `json:"estimated"`
		CostUSD          float64 `json:"cost_usd"`
	} `json:"recent"`
}

func usageOf(t *testing.T, admin, member string) usageSummary {
	t.Helper()
	code, body := adminCall(t, admin, http.MethodGet, "/molly/usage?member="+member, nil)
	var s usageSummary
	if err := json.Unmarshal([]byte(body), &s); code != 200 || err != nil {
		t.Fatalf("usage of %s: %d %s", member, code, body)
	}
	return s
}

func TestAuthKeysBudgetsAndLimits(t *testing.T) {
	tr := startTiers(t)
	db := filepath.Join(t.TempDir(), "registry", "molly.db")
	admin := adminSocket(t)
	g := startMolly(t, authCaddyfile(tr, admin, db, ""))
	ctx := context.Background()

	// small asks for one completion token; the upstream answers 5 + 5
	// tokens, 0.0001 USD. While it runs, molly_auth holds its worst case:
	// its prompt at its bound (the body's bytes, a request's and a
	// message's allowance) and the one completion token, at 10 USD/1M.
	small := func(text string) openai.ChatCompletionNewParams {
		p := chat(text)
		p.MaxTokens = openai.Int(1)
		return p
	}
	worst := float64(len(sentBody(t, small("request 1")))+classify.BoundPerRequest+classify.BoundPerMessage+1) * 10 / 1e6
	// alice's budget holds two answers and one more worst case, not three
	// answers and a worst case: her third small request is served, her
	// fourth refused.
	aliceBudget := 0.0002 + worst + 0.00005
	members := []map[string]any{
		{"name": "alice", "budget_usd": aliceBudget, "period": "month"},
		{"name": "bob", "rpm": 3},
		{"name": "carol", "models": []string{"gpt-4o-mini"}},
		{"name": "erin", "budget_usd": aliceBudget},
	}
	for _, m := range members {
		if code, body := adminCall(t, admin, http.MethodPost, "/molly/members", m); code != http.StatusCreated {
			t.Fatalf("creating %v: %d %s", m["name"], code, body)
		}
	}
	// The admin routes' errors are OpenAI's error objects, as the site's are.
	if code, body := adminCall(t, admin, http.MethodPost, "/molly/members", map[string]any{"name": "dave", "period": "week"}); code != http.StatusBadRequest ||
		!strings.Contains(gjson.Get(body, "error.message").Str, "period") || gjson.Get(body, "error.type").Str != "invalid_request_error" {
		t.Fatalf("a bad period: %d %s", code, body)
	}
	if code, body := adminCall(t, admin, http.MethodPost, "/molly/keys", map[string]string{"member": "nobody"}); code != http.StatusNotFound ||
		gjson.Get(body, "error.code").Str != "not_found" || !gjson.Get(body, "error.param").Exists() {
		t.Fatalf("a key for an unknown member: %d %s", code, body)
	}
	if code, body := adminCall(t, admin, http.MethodPut, "/molly/members", nil); code != http.StatusMethodNotAllowed ||
		gjson.Get(body, "error.code").Str != "method_not_supported" {
		t.Fatalf("PUT /molly/members: %d %s", code, body)
	}
	// A path under /molly/ that no route serves is a 404 in the same shape,
	// not the plain text of Caddy's admin mux; the routes beside it still
	// answer (POST /molly/members above, GET /molly/usage below).
	for _, path := range []string{"/molly/nope", "/molly/members/alice", "/molly/usage/alice", "/molly"} {
		if code, body := adminCall(t, admin, http.MethodGet, path, nil); code != http.StatusNotFound || gjson.Get(body, "error.code").Str != "not_found" ||
			gjson.Get(body, "error.type").Str != "invalid_request_error" || !strings.Contains(gjson.Get(body, "error.message").Str, path) {
			t.Fatalf("GET %s: %d %s", path, code, body)
		}
	}
	if code, body := adminCall(t, admin, http.MethodPost, "/molly/members", map[string]any{"name": strings.Repeat("a", 1<<17)}); code != http.StatusRequestEntityTooLarge ||
		gjson.Get(body, "error.code").Str != "request_too_large" {
		t.Fatalf("a body over 64 KiB: %d %s", code, body)
	}
	aliceKey, _ := newKey(t, admin, "alice")
	bobKey, _ := newKey(t, admin, "bob")
	carolKey, carolPrefix := newKey(t, admin, "carol")
	erinKey, _ := newKey(t, admin, "erin")
	keys := []string{aliceKey, bobKey, carolKey, erinKey}

	t.Run("requests without a key or with a wrong one get 401 invalid_api_key", func(t *testing.T) {
		resp, err := http.Post(g.URL+"/chat/completions", "application/json", strings.NewReader(`{"model":"chat","messages":[{"role":"user","content":"hi"}]}`))
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 401 || !strings.Contains(string(b), `"code":"invalid_api_key"`) || resp.Header.Get("WWW-Authenticate") == "" {
			t.Fatalf("no key: %d %s", resp.StatusCode, b)
		}
		wrong := aliceKey[:len(aliceKey)-4] + "abcd"
		for _, key := range []string{wrong, "sk-client-key-not-a-molly-key"} {
			_, err := keyClient(g, key).Chat.Completions.New(ctx, chat("hi"))
			apiErr := apiError(t, err)
			if apiErr.StatusCode != 401 || apiErr.Code != "invalid_api_key" || strings.Contains(apiErr.RawJSON(), key) {
				t.Fatalf("key %q: %d %s", key, apiErr.StatusCode, apiErr.RawJSON())
			}
		}
		if tr.t2.Count() != 0 {
			t.Fatal("an unauthenticated request reached the upstream")
		}
	})

	t.Run("the budget trips at the request after the one that spends it", func(t *testing.T) {
		c := keyClient(g, aliceKey)
		for i := 1; i <= 3; i++ {
			if _, err := c.Chat.Completions.New(ctx, small(fmt.Sprintf("request %d", i))); err != nil {
				t.Fatalf("request %d of a 0.0003 USD budget at 0.0001 each: %v", i, err)
			}
		}
		_, err := c.Chat.Completions.New(ctx, small("request 4"))
		apiErr := apiError(t, err)
		if apiErr.StatusCode != 429 || apiErr.Code != "insufficient_quota" || apiErr.Type != "insufficient_quota" {
			t.Fatalf("request 4: %d %s", apiErr.StatusCode, apiErr.RawJSON())
		}
		// A spent budget is a 429 SDKs would retry: x-should-retry says not to.
		if h := apiErr.Response.Header; h.Get("X-Should-Retry") != "false" || !strings.HasPrefix(h.Get("X-Request-Id"), "req_") {
			t.Fatalf("request 4 headers: x-should-retry %q, x-request-id %q", h.Get("X-Should-Retry"), h.Get("X-Request-Id"))
		}
		s := usageOf(t, admin, "alice")
		if s.Requests != 3 || math.Abs(s.SpentUSD-0.0003) > 1e-12 || s.RemainingUSD == nil || math.Abs(*s.RemainingUSD-(aliceBudget-0.0003)) > 1e-12 || s.PromptTokens != 15 || s.CompletionTokens != 15 {
			t.Fatalf("alice's usage %+v", s)
		}
	})

	t.Run("concurrent requests never spend past the budget", func(t *testing.T) {
		// erin's budget holds one worst case at a time, and at most three
		// answers however the ten requests interleave.
		c := keyClient(g, erinKey)
		var wg sync.WaitGroup
		var mu sync.Mutex
		served, refused := 0, 0
		for i := range 10 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, err := c.Chat.Completions.New(ctx, small(fmt.Sprintf("parallel %d", i)))
				mu.Lock()
				defer mu.Unlock()
				var apiErr *openai.Error
				switch {
				case err == nil:
					served++
				case errors.As(err, &apiErr) && apiErr.StatusCode == 429 && apiErr.Code == "insufficient_quota":
					refused++
				default:
					t.Errorf("parallel %d: %v", i, err)
				}
			}()
		}
		wg.Wait()
		s := usageOf(t, admin, "erin")
		if served < 1 || served > 3 || served+refused != 10 || s.Requests != served || math.Abs(s.SpentUSD-0.0001*float64(served)) > 1e-12 || s.SpentUSD > aliceBudget {
			t.Fatalf("served %d, refused %d; erin's usage %+v (budget %v)", served, refused, s, aliceBudget)
		}
	})

	t.Run("a stream's usage is counted and hidden from a client that did not ask", func(t *testing.T) {
		c := keyClient(g, bobKey)
		stream := c.Chat.Completions.NewStreaming(ctx, chat("stream me"))
		var acc openai.ChatCompletionAccumulator
		for stream.Next() {
			acc.AddChunk(stream.Current())
		}
		if err := stream.Err(); err != nil {
			t.Fatal(err)
		}
		if acc.Choices[0].Message.Content != "t2 says: stream me" || acc.Usage.TotalTokens != 0 {
			t.Fatalf("streamed %q with usage %+v", acc.Choices[0].Message.Content, acc.Usage)
		}
		s := usageOf(t, admin, "bob")
		// The test upstream reports 5 prompt tokens and one per chunk (4).
		if s.Requests != 1 || len(s.Recent) != 1 || s.Recent[0].PromptTokens != 5 || s.Recent[0].CompletionTokens != 4 || s.Recent[0].Estimated || s.Recent[0].CostUSD != 0.00009 {
			t.Fatalf("bob's usage after a stream %+v", s)
		}
	})

	t.Run("the RPM limit answers 429 with Retry-After at the request past it", func(t *testing.T) {
		c := keyClient(g, bobKey) // one request already made in this minute
		for i := 2; i <= 3; i++ {
			if _, err := c.Chat.Completions.New(ctx, chat("again")); err != nil {
				t.Fatalf("request %d of 3 per minute: %v", i, err)
			}
		}
		_, err := c.Chat.Completions.New(ctx, chat("one too many"))
		apiErr := apiError(t, err)
		retry, _ := strconv.Atoi(apiErr.Response.Header.Get("Retry-After"))
		if apiErr.StatusCode != 429 || apiErr.Code != "rate_limit_exceeded" || retry < 30 || retry > 60 {
			t.Fatalf("request 4: %d Retry-After %q %s", apiErr.StatusCode, apiErr.Response.Header.Get("Retry-After"), apiErr.RawJSON())
		}
		if s := usageOf(t, admin, "bob"); s.Requests != 3 {
			t.Fatalf("bob's requests %d, want 3", s.Requests)
		}
	})

	t.Run("a model outside the key's scope gets 403", func(t *testing.T) {
		_, err := keyClient(g, carolKey).Chat.Completions.New(ctx, chat("hi"))
		apiErr := apiError(t, err)
		if apiErr.StatusCode != 403 || apiErr.Code != "model_not_allowed" {
			t.Fatalf("carol: %d %s", apiErr.StatusCode, apiErr.RawJSON())
		}
	})

	t.Run("molly keys creates, lists and revokes keys through the admin API", func(t *testing.T) {
		run := func(args ...string) string {
			out, err := exec.Command(mollyBin, append(args, "--address", admin)...).Output()
			if err != nil {
				var ee *exec.ExitError
				if errors.As(err, &ee) {
					t.Fatalf("molly %v: %v: %s", args, err, ee.Stderr)
				}
				t.Fatalf("molly %v: %v", args, err)
			}
			return string(out)
		}
		key := strings.TrimSpace(run("keys", "create", "--member", "carol", "--name", "cli"))
		if !strings.HasPrefix(key, "sk-molly-") || len(key) != 52 {
			t.Fatalf("molly keys create printed %q", key)
		}
		keys = append(keys, key)
		list := run("keys", "list", "--member", "carol")
		if !strings.Contains(list, key[:17]) || !strings.Contains(list, carolPrefix) || strings.Contains(list, key) || strings.Contains(list, carolKey) {
			t.Fatalf("molly keys list:\n%s", list)
		}
		run("keys", "revoke", carolPrefix)
		_, err := keyClient(g, carolKey).Chat.Completions.New(ctx, chat("hi"))
		if apiErr := apiError(t, err); apiErr.StatusCode != 401 {
			t.Fatalf("a revoked key: %d", apiErr.StatusCode)
		}
		_, err = keyClient(g, key).Chat.Completions.New(ctx, chat("hi"))
		if apiErr := apiError(t, err); apiErr.StatusCode != 403 {
			t.Fatalf("carol's other key stops authenticating: %d", apiErr.StatusCode)
		}
		if code, body := adminCall(t, admin, http.MethodGet, "/molly/keys", nil); code != 200 || !strings.Contains(body, `"revoked"`) || strings.Contains(body, key) {
			t.Fatalf("GET /molly/keys: %d %s", code, body)
		}
	})

	// Keys never reach the logs, whatever happened above.
	logs := g.logs.String()
	for _, k := range keys {
		if strings.Contains(logs, k) || strings.Contains(logs, k[17:]) {
			t.Fatalf("the logs contain a key")
		}
	}

	t.Run("a restart after kill -9 keeps the spend", func(t *testing.T) {
		_ = g.cmd.Process.Kill() // SIGKILL: no clean shutdown
		_ = g.cmd.Wait()
		admin2 := adminSocket(t)
		g2 := startMolly(t, authCaddyfile(tr, admin2, db, "anonymous guest"))
		_, err := keyClient(g2, aliceKey).Chat.Completions.New(ctx, chat("after restart"))
		if apiErr := apiError(t, err); apiErr.StatusCode != 429 || apiErr.Code != "insufficient_quota" {
			t.Fatalf("alice after restart: %d %s", apiErr.StatusCode, apiErr.RawJSON())
		}
		if s := usageOf(t, admin2, "alice"); math.Abs(s.SpentUSD-0.0003) > 1e-12 || s.Requests != 3 {
			t.Fatalf("alice's usage after restart %+v", s)
		}
		// The RPM window is in the registry too: bob's three requests of
		// this minute still count (RPM windows persist across restarts).
		_, err = keyClient(g2, bobKey).Chat.Completions.New(ctx, chat("bob is back"))
		if apiErr := apiError(t, err); apiErr.StatusCode != 429 || apiErr.Code != "rate_limit_exceeded" || apiErr.Response.Header.Get("Retry-After") == "" {
			t.Fatalf("bob after restart, his minute still full: %d %s", apiErr.StatusCode, apiErr.RawJSON())
		}

		// With `anonymous guest`, a request without a Molly key is guest's.
		if _, err := keyClient(g2, "unused").Chat.Completions.New(ctx, chat("local use")); err != nil {
			t.Fatalf("anonymous request: %v", err)
		}
		if s := usageOf(t, admin2, "guest"); s.Requests != 1 || s.PromptTokens != 5 {
			t.Fatalf("guest's usage %+v", s)
		}
		// A Molly-shaped key must still be valid.
		_, err = keyClient(g2, aliceKey[:len(aliceKey)-4]+"abcd").Chat.Completions.New(ctx, chat("hi"))
		if apiErr := apiError(t, err); apiErr.StatusCode != 401 {
			t.Fatalf("a wrong Molly key in anonymous mode: %d", apiErr.StatusCode)
		}
		for _, k := range keys {
			if strings.Contains(g2.logs.String(), k) {
				t.Fatal("the logs contain a key")
			}
		}
	})
}

// TestAuthDirectiveRunsFirst: whatever the order in the Caddyfile, the
// handlers run auth → classify → policy → route.
func TestAuthDirectiveRunsFirst(t *testing.T) {
	cfg := filepath.Join(t.TempDir(), "Caddyfile")
	body := `{
	molly {
		target t {
			tier T2
			endpoint http://127.0.0.1:1/v1
			models m
		}
	}
}
:8080 {
	molly_route
	molly_policy
	molly_classify
	molly_auth {
		anonymous me
	}
}
`
	if err := os.WriteFile(cfg, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(mollyBin, "adapt", "--config", cfg, "--adapter", "caddyfile").Output()
	if err != nil {
		t.Fatalf("adapt: %v", err)
	}
	last := -1
	for _, h := range []string{`"handler":"molly_auth"`, `"handler":"molly_classify"`, `"handler":"molly_policy"`, `"handler":"molly_route"`} {
		i := strings.Index(string(out), h)
		if i <= last {
			t.Fatalf("%s out of order in:\n%s", h, out)
		}
		last = i
	}
	if !strings.Contains(string(out), `"anonymous":"me"`) {
		t.Fatalf("anonymous setting lost:\n%s", out)
	}
}
