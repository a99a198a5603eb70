package pipeline

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tidwall/gjson"

	"github.com/molly-gateway/molly/internal/policytest"
	"github.com/molly-gateway/molly/internal/upstreamtest"
	"github.com/molly-gateway/molly/policies"
	"github.com/molly-gateway/molly/router/classify"
	"github.com/molly-gateway/molly/router/identity"
	"github.com/molly-gateway/molly/router/openai"
	"github.com/molly-gateway/molly/router/route"
)

// threeTiers starts upstreams for T1 (lan), T2 (remote) and T3 (cloud);
// the objective prefers cloud, then remote, then lan.
func threeTiers(t *testing.T) (lan, remote, cloud *upstreamtest.Upstream, targets []*route.Target) {
	lan, remote, cloud = upstreamtest.Start("lan"), upstreamtest.Start("remote"), upstreamtest.Start("cloud")
	t.Cleanup(func() { lan.Close(); remote.Close(); cloud.Close() })
	targets = []*route.Target{
		{Name: "lan", Tier: "T1", Endpoint: lan.URL(), Models: []string{"m"}, Quality: map[string]float64{"default": 0.5}},
		{Name: "remote", Tier: "T2", Endpoint: remote.URL(), Models: []string{"m"}, Quality: map[string]float64{"default": 0.6}},
		{Name: "cloud", Tier: "T3", Endpoint: cloud.URL(), Models: []string{"m=gpt-up"}, Quality: map[string]float64{"default": 0.9}, PriceIn: 1, PriceOut: 1},
	}
	return lan, remote, cloud, targets
}

func TestRoutesByPolicyAndObjective(t *testing.T) {
	lan, remote, cloud, targets := threeTiers(t)
	gw, _ := startGateway(t, setup{targets: targets})
	chat := gw.URL + "/v1/chat/completions"

	t.Run("a public prompt goes to the target the objective prefers", func(t *testing.T) {
		r := post(t, chat, chatBody("what is the capital of France?"))
		if r.status != 200 || r.header.Get(HeaderTier) != "T3" || r.header.Get(HeaderTarget) != "cloud" || r.header.Get(HeaderPlan) != "single" {
			t.Fatalf("status %d tier %q target %q: %s", r.status, r.header.Get(HeaderTier), r.header.Get(HeaderTarget), r.body)
		}
		if got := gjson.Get(r.body, "choices.0.message.content").String(); got != "cloud says: what is the capital of France?" {
			t.Fatalf("answer = %q", got)
		}
		if len(r.header.Get(HeaderDecisionID)) != 36 {
			t.Fatalf("decision id = %q", r.header.Get(HeaderDecisionID))
		}
		got := cloud.Received()
		if len(got) != 1 || gjson.GetBytes(got[0], "model").String() != "gpt-up" {
			t.Fatalf("cloud received %q; want one request for gpt-up", got)
		}
		if h := cloud.Headers()[0]; h.Get("X-Molly-Decision-Id") != "" || h.Get("Content-Type") != "application/json" {
			t.Fatalf("cloud headers = %v; want no decision id for an external API", h)
		}
	})
	t.Run("an email never reaches T3 and goes to the best self-hosted tier", func(t *testing.T) {
		r := post(t, chat, chatBody("write to alice@example.com"))
		if r.status != 200 || r.header.Get(HeaderTarget) != "remote" {
			t.Fatalf("status %d target %q: %s", r.status, r.header.Get(HeaderTarget), r.body)
		}
		if cloud.Contains("alice@example.com") || !remote.Contains("alice@example.com") {
			t.Fatal("the address went to cloud, or not to remote")
		}
		if h := remote.Headers()[0]; h.Get("X-Molly-Decision-Id") != r.header.Get(HeaderDecisionID) {
			t.Fatalf("remote got decision id %q, client %q", h.Get("X-Molly-Decision-Id"), r.header.Get(HeaderDecisionID))
		}
		// 13 prompt tokens, 256 assumed completion tokens, free targets: the scores are the priors.
		if got, want := r.header.Get(HeaderRoute), "remote/m score=0.6000; runner-up lan/m score=0.5000; excluded cloud: tier T3 not allowed by the policy"; got != want {
			t.Fatalf("X-Molly-Route = %q, want %q", got, want)
		}
	})
	t.Run("a card stays on the LAN", func(t *testing.T) {
		r := post(t, chat, chatBody("charge 4111 1111 1111 1111"))
		if r.status != 200 || r.header.Get(HeaderTarget) != "lan" || cloud.Contains("4111") || remote.Contains("4111") {
			t.Fatalf("status %d target %q: %s", r.status, r.header.Get(HeaderTarget), r.body)
		}
	})
	t.Run("a card in metadata stays on the LAN too", func(t *testing.T) {
		r := post(t, chat, `{"model":"m","metadata":{"data":"4111 1111 1111 1112 is wrong, 4012888888881881 is right"},"messages":[{"role":"user","content":"pay it"}]}`)
		if r.status != 200 || r.header.Get(HeaderTarget) != "lan" || cloud.Contains("4012888888881881") || remote.Contains("4012888888881881") {
			t.Fatalf("status %d target %q: %s", r.status, r.header.Get(HeaderTarget), r.body)
		}
	})
	t.Run("a declared class raises the routing", func(t *testing.T) {
		r := post(t, chat, chatBody("plain words"), "X-Molly-Sensitivity", "confidential")
		if r.header.Get(HeaderTarget) != "lan" || cloud.Contains("plain words") {
			t.Fatalf("target %q", r.header.Get(HeaderTarget))
		}
	})
	t.Run("opaque content is treated as confidential by the default policy", func(t *testing.T) {
		r := post(t, gw.URL+"/v1/completions", `{"model":"m","prompt":[1,2,3]}`)
		if r.status != 200 || r.header.Get(HeaderTarget) != "lan" || cloud.Count() != 1 {
			t.Fatalf("status %d target %q: %s", r.status, r.header.Get(HeaderTarget), r.body)
		}
	})
	t.Run("a secret is refused when no T0 target exists", func(t *testing.T) {
		r := post(t, chat, chatBody("key sk-proj-abcdefghijklmnopqrstuvwxyzABCDEF0123456789abcd"))
		// Nothing can change the decision: a 403 no SDK retries, with the policy's reasons.
		if r.status != 403 || gjson.Get(r.body, "error.code").String() != "target_not_allowed" || r.header.Get("Retry-After") != "" {
			t.Fatalf("status %d: %s", r.status, r.body)
		}
		if got, want := r.header.Get(HeaderRoute), "none; excluded lan: tier T1 not allowed by the policy; excluded remote: tier T2 not allowed by the policy; excluded cloud: tier T3 not allowed by the policy"; got != want {
			t.Fatalf("X-Molly-Route = %q, want %q", got, want)
		}
		want := "No allowed target is available for model `m` (lan: tier T1 not allowed by the policy; remote: tier T2 not allowed by the policy; cloud: tier T3 not allowed by the policy). The policy decided: sensitivity restricted allows T0; SECRET detected 1 time(s)."
		if got := gjson.Get(r.body, "error.message").String(); got != want {
			t.Fatalf("message = %q\nwant      %q", got, want)
		}
		for _, u := range []*upstreamtest.Upstream{lan, remote, cloud} {
			if u.Contains("sk-proj") {
				t.Fatalf("%s received the secret", u.Name)
			}
		}
	})
	t.Run("an unknown model is 404", func(t *testing.T) {
		r := post(t, chat, `{"model":"nope","messages":[{"role":"user","content":"hi"}]}`)
		if r.status != 404 || gjson.Get(r.body, "error.code").String() != "model_not_found" || gjson.Get(r.body, "error.param").String() != "model" {
			t.Fatalf("status %d: %s", r.status, r.body)
		}
	})
	t.Run("completions and embeddings are forwarded to their paths", func(t *testing.T) {
		r := post(t, gw.URL+"/v1/completions", `{"model":"m","prompt":"say hi"}`)
		if r.status != 200 || gjson.Get(r.body, "choices.0.text").String() != "cloud says: say hi" {
			t.Fatalf("completions: %d %s", r.status, r.body)
		}
		r = post(t, gw.URL+"/v1/embeddings", `{"model":"m","input":"embed"}`)
		if r.status != 200 || gjson.Get(r.body, "data.0.embedding.#").Int() != 3 || gjson.Get(r.body, "model").String() != "m" {
			t.Fatalf("embeddings: %d %s", r.status, r.body)
		}
	})
	t.Run("the model list shows what the caller may reach", func(t *testing.T) {
		r := get(t, gw.URL+"/v1/models")
		if r.status != 200 || r.body != `{"object":"list","data":[{"id":"m","object":"model","created":0,"owned_by":"molly"}]}` {
			t.Fatalf("models: %d %s", r.status, r.body)
		}
		if r = get(t, gw.URL+"/v1/models/m"); r.status != 200 || r.body != `{"id":"m","object":"model","created":0,"owned_by":"molly"}` {
			t.Fatalf("one model: %d %s", r.status, r.body)
		}
		if r = get(t, gw.URL+"/v1/models/nope"); r.status != 404 || gjson.Get(r.body, "error.code").String() != "model_not_found" {
			t.Fatalf("an unknown model: %d %s", r.status, r.body)
		}
	})
}

func TestRestoresPlaceholdersInTheAnswer(t *testing.T) {
	_, _, cloud, targets := threeTiers(t)
	cls := classify.New(testScanner(t), map[string]classify.Sensitivity{"EMAIL": classify.Public})
	gw, _ := startGateway(t, setup{targets: targets, cls: cls})
	for _, stream := range []bool{false, true} {
		t.Run(fmt.Sprintf("stream=%v", stream), func(t *testing.T) {
			body := fmt.Sprintf(`{"model":"m","stream":%v,"messages":[{"role":"user","content":"write to alice@example.com"}]}`, stream)
			r := post(t, gw.URL+"/v1/chat/completions", body)
			if r.status != 200 || r.header.Get(HeaderTarget) != "cloud" {
				t.Fatalf("status %d target %q: %s", r.status, r.header.Get(HeaderTarget), r.body)
			}
			if cloud.Contains("alice@example.com") || !cloud.Contains("write to [EMAIL_1]") {
				t.Fatalf("cloud received %q", cloud.Received())
			}
			answer := gjson.Get(r.body, "choices.0.message.content").String()
			if stream {
				answer = sseContent(t, r.body)
			}
			if answer != "cloud says: write to alice@example.com" {
				t.Fatalf("answer = %q", answer)
			}
		})
	}
}

func TestFallsBack(t *testing.T) {
	tests := []struct {
		name   string
		status int // of the preferred upstream; 0 means it is down
	}{
		{"a 500 falls back to the next candidate", 500},
		{"a 503 falls back", 503},
		{"a 429 falls back", 429},
		{"a refused connection falls back", 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			lan := upstreamtest.Start("lan")
			t.Cleanup(lan.Close)
			bad, hits := failing(t, tt.status)
			if tt.status == 0 {
				bad.Close()
			}
			gw, _ := startGateway(t, setup{targets: []*route.Target{
				{Name: "lan", Tier: "T1", Endpoint: lan.URL(), Models: []string{"m"}, Quality: map[string]float64{"default": 0.5}},
				{Name: "best", Tier: "T2", Endpoint: bad.URL + "/v1", Models: []string{"m"}, Quality: map[string]float64{"default": 0.9}},
			}})
			r := post(t, gw.URL+"/v1/chat/completions", chatBody("hello"))
			if r.status != 200 || r.header.Get(HeaderTarget) != "lan" || gjson.Get(r.body, "choices.0.message.content").String() != "lan says: hello" {
				t.Fatalf("status %d target %q: %s", r.status, r.header.Get(HeaderTarget), r.body)
			}
			if !strings.HasSuffix(r.header.Get(HeaderRoute), "; fallback") {
				t.Fatalf("X-Molly-Route = %q, want it to say fallback", r.header.Get(HeaderRoute))
			}
			if tt.status != 0 && hits.Load() != 1 {
				t.Fatalf("the preferred upstream got %d requests, want 1", hits.Load())
			}
		})
	}
	t.Run("a 4xx other than 429 is the answer, not a failure", func(t *testing.T) {
		bad, _ := failing(t, 400)
		lan := upstreamtest.Start("lan")
		t.Cleanup(lan.Close)
		gw, _ := startGateway(t, setup{targets: []*route.Target{
			{Name: "lan", Tier: "T1", Endpoint: lan.URL(), Models: []string{"m"}, Quality: map[string]float64{"default": 0.5}},
			{Name: "best", Tier: "T2", Endpoint: bad.URL + "/v1", Models: []string{"m"}, Quality: map[string]float64{"default": 0.9}},
		}})
		r := post(t, gw.URL+"/v1/chat/completions", chatBody("hello"))
		if r.status != 400 || r.header.Get(HeaderTarget) != "best" || lan.Count() != 0 {
			t.Fatalf("status %d target %q", r.status, r.header.Get(HeaderTarget))
		}
	})
	t.Run("when every candidate fails the client gets 503 naming each", func(t *testing.T) {
		a, _ := failing(t, 500)
		b, _ := failing(t, 502)
		gw, _ := startGateway(t, setup{targets: []*route.Target{
			{Name: "a", Tier: "T1", Endpoint: a.URL + "/v1", Models: []string{"m"}, Quality: map[string]float64{"default": 0.9}},
			{Name: "b", Tier: "T2", Endpoint: b.URL + "/v1", Models: []string{"m"}, Quality: map[string]float64{"default": 0.5}},
		}})
		r := post(t, gw.URL+"/v1/chat/completions", chatBody("hello"))
		want := "All allowed targets for model `m` failed (a: HTTP 500 Internal Server Error; b: HTTP 502 Bad Gateway)."
		if r.status != 503 || gjson.Get(r.body, "error.message").String() != want {
			t.Fatalf("status %d: %s", r.status, r.body)
		}
	})
	t.Run("fallback never leaves the allowed tiers", func(t *testing.T) {
		bad, _ := failing(t, 500)
		cloud := upstreamtest.Start("cloud")
		t.Cleanup(cloud.Close)
		gw, _ := startGateway(t, setup{targets: []*route.Target{
			{Name: "lan", Tier: "T1", Endpoint: bad.URL + "/v1", Models: []string{"m"}},
			{Name: "cloud", Tier: "T3", Endpoint: cloud.URL(), Models: []string{"m"}},
		}})
		r := post(t, gw.URL+"/v1/chat/completions", chatBody("mail alice@example.com"))
		want := "All allowed targets for model `m` failed (cloud: tier T3 not allowed by the policy; lan: HTTP 500 Internal Server Error)."
		if r.status != 503 || cloud.Count() != 0 || gjson.Get(r.body, "error.message").String() != want {
			t.Fatalf("status %d, cloud got %d requests: %s", r.status, cloud.Count(), r.body)
		}
	})
	// A LAN target that redirects to an external API must not get the
	// external API the prompt its tier forbids: the redirect is a failed
	// attempt, never followed.
	for _, code := range []int{http.StatusTemporaryRedirect, http.StatusPermanentRedirect, http.StatusFound} {
		t.Run(fmt.Sprintf("a %d is not followed out of the allowed tiers", code), func(t *testing.T) {
			cloud := upstreamtest.Start("cloud")
			t.Cleanup(cloud.Close)
			var hits atomic.Int64
			redirecting := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				hits.Add(1)
				http.Redirect(w, r, cloud.URL()+"/chat/completions", code)
			}))
			t.Cleanup(redirecting.Close)
			gw, _ := startGateway(t, setup{targets: []*route.Target{
				{Name: "lan", Tier: "T1", Endpoint: redirecting.URL + "/v1", Models: []string{"m"}},
				{Name: "cloud", Tier: "T3", Endpoint: cloud.URL(), Models: []string{"m"}},
			}})
			r := post(t, gw.URL+"/v1/chat/completions", chatBody("mail alice@example.com"))
			want := fmt.Sprintf("All allowed targets for model `m` failed (cloud: tier T3 not allowed by the policy; lan: HTTP %d %s (a redirect, not followed: the request goes to its target only)).",
				code, http.StatusText(code))
			if r.status != 503 || hits.Load() != 1 || cloud.Count() != 0 || gjson.Get(r.body, "error.message").String() != want {
				t.Fatalf("status %d, lan got %d requests, cloud %d: %s", r.status, hits.Load(), cloud.Count(), r.body)
			}
		})
	}
}

// heldUpstream streams one chunk per word of the last message, then waits
// for release (or the request's end) before the finish chunk and [DONE].
type heldUpstream struct {
	release chan struct{}
	first   string // the stream's first event, when set, instead of the words
}

func (h *heldUpstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	w.Header().Set("Content-Type", "text/event-stream")
	w.WriteHeader(200)
	if h.first != "" {
		fmt.Fprintf(w, "data: %s\n\n", h.first)
		w.(http.Flusher).Flush()
	} else {
		for _, word := range strings.Fields(gjson.GetBytes(body, "messages.0.content").String()) {
			fmt.Fprintf(w, "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":%q},\"finish_reason\":null}]}\n\n", word)
			w.(http.Flusher).Flush()
		}
	}
	select {
	case <-h.release:
	case <-r.Context().Done():
		return
	}
	fmt.Fprint(w, "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n")
}

func TestStreams(t *testing.T) {
	t.Run("chunks reach the client as they come", func(t *testing.T) {
		up := &heldUpstream{release: make(chan struct{})}
		srv := httptest.NewServer(up)
		t.Cleanup(srv.Close)
		gw, _ := startGateway(t, setup{targets: []*route.Target{{Name: "lan", Tier: "T1", Endpoint: srv.URL + "/v1", Models: []string{"m"}}}})
		resp, err := http.Post(gw.URL+"/v1/chat/completions", "application/json", strings.NewReader(streamBody("alpha beta", false)))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" || resp.Header.Get(HeaderTier) != "T1" {
			t.Fatalf("content type %q tier %q", ct, resp.Header.Get(HeaderTier))
		}
		// Both word chunks arrive while the upstream is still waiting: nothing is buffered.
		br := bufio.NewReader(resp.Body)
		for _, want := range []string{"alpha", "beta"} {
			line, err := br.ReadString('\n')
			if err != nil || gjson.Get(strings.TrimPrefix(line, "data: "), "choices.0.delta.content").String() != want {
				t.Fatalf("line = %q, %v; want the %s chunk", line, err, want)
			}
			_, _ = br.ReadString('\n')
		}
		close(up.release)
		rest, _ := io.ReadAll(br)
		if !strings.HasSuffix(string(rest), "data: [DONE]\n\n") {
			t.Fatalf("stream end = %q", rest)
		}
	})
	t.Run("a truncated upstream stream ends in an error event, never [DONE]", func(t *testing.T) {
		lan := upstreamtest.Start("lan")
		t.Cleanup(lan.Close)
		gw, _ := startGateway(t, setup{targets: []*route.Target{{Name: "lan", Tier: "T1", Endpoint: lan.URL(), Models: []string{"m"}}}})
		r := post(t, gw.URL+"/v1/chat/completions", streamBody("TRUNCATE please", false))
		if r.status != 200 || !strings.HasSuffix(r.body, "event: error\ndata: "+streamTruncated+"\n\n") || strings.Contains(r.body, "[DONE]") || strings.Contains(r.body, `"finish_reason":"stop"`) {
			t.Fatalf("status %d body %q", r.status, r.body)
		}
	})
}

// TestAStreamThatFailsBeforeItsFirstTokenFallsBack: nothing of a stream
// reaches the client before its first content event, so an error inside
// a 200 stream, an early end or a first event that does not come falls
// back like any failed attempt.
func TestAStreamThatFailsBeforeItsFirstTokenFallsBack(t *testing.T) {
	for _, tc := range []struct {
		name    string
		handler http.HandlerFunc
		timeout time.Duration
		why     string
	}{
		{"a rate-limit error object as the first event", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "text/event-stream")
			fmt.Fprint(w, "data: {\"error\":{\"message\":\"Rate limit reached\",\"type\":\"requests\",\"code\":\"rate_limit_exceeded\"}}\n\n")
		}, 0, "rate_limited"},
		{"a stream that ends before its first token", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "text/event-stream")
			fmt.Fprint(w, ": keep-alive\n\ndata: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\"},\"finish_reason\":null}]}\n\ndata: [DONE]\n\n")
		}, 0, "empty_stream"},
		{"a first event that does not come in time", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "text/event-stream")
			w.WriteHeader(200)
			w.(http.Flusher).Flush()
			<-r.Context().Done()
		}, 100 * time.Millisecond, "timeout"},
		{"a 200 that is neither a stream nor an answer", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "text/html")
			fmt.Fprint(w, `<html>portal</html>`)
		}, 0, "bad_answer"},
		{"a whole answer without choices", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprint(w, `{"choices":[]}`)
		}, 0, "empty_stream"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bad := httptest.NewServer(tc.handler)
			t.Cleanup(bad.Close)
			lan := upstreamtest.Start("lan")
			t.Cleanup(lan.Close)
			ledger := &memLedger{}
			gw, _ := startGateway(t, setup{targets: []*route.Target{
				{Name: "best", Tier: "T1", Endpoint: bad.URL + "/v1", Models: []string{"m"}, Quality: map[string]float64{"default": 0.9}, PriceIn: 1},
				{Name: "lan", Tier: "T1", Endpoint: lan.URL(), Models: []string{"m"}, Quality: map[string]float64{"default": 0.5}},
			}, id: &identity.Identity{Member: "ann", Ledger: ledger}, edit: func(p *Pipeline) { p.FirstEventTimeout = tc.timeout }})
			r := post(t, gw.URL+"/v1/chat/completions", streamBody("hello there", false))
			if r.status != 200 || r.header.Get(HeaderTarget) != "lan" || sseContent(t, r.body) != "lan says: hello there" {
				t.Fatalf("status %d target %q: %s", r.status, r.header.Get(HeaderTarget), r.body)
			}
			if strings.Contains(r.body, "Rate limit") || strings.Contains(r.body, "keep-alive") {
				t.Fatalf("the failed stream reached the client: %s", r.body)
			}
			// The failed attempt produced nothing: only the answer is billed.
			if rec := ledger.take(); len(rec) != 1 || rec[0].Target != "lan" {
				t.Fatalf("billed %+v; want one record, for lan", rec)
			}
		})
	}
}

func TestEngineTargetInProcess(t *testing.T) {
	eng := demoEngine(t)
	gw, p := startGateway(t, setup{engine: eng, targets: []*route.Target{{Name: "engine", Tier: "T0", Kind: route.KindEngine, Models: []string{"m=molly-demo"}}}})
	t.Run("a restricted request is answered by the engine without a network hop", func(t *testing.T) {
		r := post(t, gw.URL+"/v1/chat/completions", `{"model":"m","max_tokens":4,"messages":[{"role":"user","content":"key sk-proj-abcdefghijklmnopqrstuvwxyzABCDEF0123456789abcd"}]}`)
		if r.status != 200 || r.header.Get(HeaderTier) != "T0" || r.header.Get(HeaderTarget) != "engine" || gjson.Get(r.body, "model").String() != "m" {
			t.Fatalf("status %d tier %q: %s", r.status, r.header.Get(HeaderTier), r.body)
		}
		if n := gjson.Get(r.body, "usage.completion_tokens").Int(); n < 1 || n > 4 {
			t.Fatalf("%d completion tokens for max_tokens 4: %s", n, r.body)
		}
	})
	t.Run("a stream arrives in chunks and ends with [DONE]", func(t *testing.T) {
		r := post(t, gw.URL+"/v1/chat/completions", `{"model":"m","stream":true,"max_tokens":4,"messages":[{"role":"user","content":"hello"}]}`)
		if r.status != 200 || !strings.HasSuffix(r.body, "data: [DONE]\n\n") || strings.Count(r.body, "data: ") < 3 || strings.Contains(r.body, `"usage"`) {
			t.Fatalf("status %d: %s", r.status, r.body)
		}
	})
	t.Run("the engine's own models and adapters are served under their names", func(t *testing.T) {
		if got := strings.Join(p.Catalogue.Models(policytest.Decide(t, policytest.Literal(t, policytest.Allow([]string{"T0"}, nil, nil)), mustClassify(t, openai.EndpointModels, "")).Decision()), ","); got !=
			"m,molly-demo,molly-demo:billing,molly-demo:legal,molly-demo:payments,molly-demo:support" {
			t.Fatalf("Models = %s", got)
		}
		r := post(t, gw.URL+"/v1/chat/completions", `{"model":"molly-demo:support","max_tokens":2,"messages":[{"role":"user","content":"hi"}]}`)
		if r.status != 200 || gjson.Get(r.body, "model").String() != "molly-demo:support" {
			t.Fatalf("status %d: %s", r.status, r.body)
		}
		if r := post(t, gw.URL+"/v1/chat/completions", `{"model":"molly-demo:nope","messages":[{"role":"user","content":"hi"}]}`); r.status != 404 {
			t.Fatalf("a model the engine does not serve: status %d", r.status)
		}
	})
}

func mustClassify(t *testing.T, ep openai.Endpoint, body string) *classify.Annotation {
	t.Helper()
	in := classify.Input{Endpoint: ep, Body: []byte(body)}
	if ep == openai.EndpointModels {
		in = classify.Input{Endpoint: ep, Path: "/v1/models"}
	}
	a, err := testClassifier(t).Classify(in)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// TestServeRefusesADecisionForOtherContent: Serve only runs under a
// decision bound to the request's own annotation.
func TestServeRefusesADecisionForOtherContent(t *testing.T) {
	lan := upstreamtest.Start("lan")
	t.Cleanup(lan.Close)
	_, p := startGateway(t, setup{targets: []*route.Target{{Name: "lan", Tier: "T1", Endpoint: lan.URL(), Models: []string{"m"}}}})
	judged, sent := mustClassify(t, openai.EndpointChat, chatBody("hello")), mustClassify(t, openai.EndpointChat, chatBody("alice@example.com"))
	d := p.Decide(context.Background(), judged, nil)
	for _, dd := range []policies.Decided{d, {}} {
		rec := httptest.NewRecorder()
		err := p.Serve(rec, httptest.NewRequest(http.MethodPost, "/v1/chat/completions", nil), sent, dd)
		if !(err != nil && err.(*openai.Error).Status == 500 && err.(*openai.Error).Code == "decision_mismatch") || lan.Count() != 0 {
			t.Fatalf("Serve = %v, lan got %d requests; want 500 decision_mismatch and nothing sent", err, lan.Count())
		}
	}
}
