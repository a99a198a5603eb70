package router

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tidwall/gjson"

	"github.com/molly-gateway/molly/api"
	"github.com/molly-gateway/molly/internal/upstreamtest"
	"github.com/molly-gateway/molly/policies"
)

// startGateway serves the classify → policy → route path of the Caddy
// modules in one handler, without Caddy: enough to test Forwarder.Serve as
// clients see it.
func startGateway(t *testing.T, cat *Catalogue, cls *Classifier, eng *policies.Engine) *httptest.Server {
	t.Helper()
	f := &Forwarder{Catalogue: cat, Weights: DefaultWeights}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ep, aerr := EndpointOf(r.Method, r.URL.Path)
		if aerr != nil {
			aerr.Write(w)
			return
		}
		body, _ := io.ReadAll(r.Body)
		a, err := cls.Classify(ep, body, r.Header.Get("X-Molly-Sensitivity"), r.Header.Get("X-Molly-Residency"))
		if err != nil {
			api.WriteError(w, err)
			return
		}
		d := eng.DecideMap(r.Context(), PolicyInput(a, "tester", cat))
		if !d.Allowed() {
			(&api.Error{Status: http.StatusForbidden, Type: "policy_denied", Message: strings.Join(d.Reasons(), "; ")}).Write(w)
			return
		}
		if err := f.Serve(w, r, a, d); err != nil {
			api.WriteError(w, err)
		}
	}))
	t.Cleanup(srv.Close)
	return srv
}

type reply struct {
	status int
	header http.Header
	body   string
}

func post(t *testing.T, url, body string, header ...string) reply {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return reply{resp.StatusCode, resp.Header, string(b)}
}

// failing is an upstream that answers every request with status.
func failing(t *testing.T, status int) (*httptest.Server, *atomic.Int64) {
	var n atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n.Add(1)
		w.WriteHeader(status)
		_, _ = io.WriteString(w, `{"error":{"message":"no","type":"server_error","param":null,"code":null}}`)
	}))
	t.Cleanup(srv.Close)
	return srv, &n
}

// threeTiers starts upstreams for T1 (lan), T2 (remote) and T3 (cloud);
// the objective prefers cloud, then remote, then lan.
func threeTiers(t *testing.T) (lan, remote, cloud *upstreamtest.Upstream, targets []*Target) {
	lan, remote, cloud = upstreamtest.Start("lan"), upstreamtest.Start("remote"), upstreamtest.Start("cloud")
	t.Cleanup(func() { lan.Close(); remote.Close(); cloud.Close() })
	targets = []*Target{
		{Name: "lan", Tier: "T1", Endpoint: lan.URL(), Models: []string{"m"}, Quality: map[string]float64{"default": 0.5}},
		{Name: "remote", Tier: "T2", Endpoint: remote.URL(), Models: []string{"m"}, Quality: map[string]float64{"default": 0.6}},
		{Name: "cloud", Tier: "T3", Endpoint: cloud.URL(), Models: []string{"m=gpt-up"}, Quality: map[string]float64{"default": 0.9}, PriceIn: 1, PriceOut: 1},
	}
	return lan, remote, cloud, targets
}

func TestForwarderRoutesByPolicyAndObjective(t *testing.T) {
	lan, remote, cloud, targets := threeTiers(t)
	gw := startGateway(t, newCatalogue(t, targets...), testClassifier(t), defaultEngine(t))
	chat := gw.URL + "/v1/chat/completions"

	t.Run("a public prompt goes to the target the objective prefers", func(t *testing.T) {
		r := post(t, chat, chatBody("what is the capital of France?"))
		if r.status != 200 || r.header.Get(HeaderTier) != "T3" || r.header.Get(HeaderTarget) != "cloud" {
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
	})
	t.Run("a card stays on the LAN", func(t *testing.T) {
		r := post(t, chat, chatBody("charge 4111 1111 1111 1111"))
		if r.status != 200 || r.header.Get(HeaderTarget) != "lan" || cloud.Contains("4111") || remote.Contains("4111") {
			t.Fatalf("status %d target %q: %s", r.status, r.header.Get(HeaderTarget), r.body)
		}
	})
	t.Run("a declared class raises the routing", func(t *testing.T) {
		r := post(t, chat, chatBody("plain words"), "X-Molly-Sensitivity", "confidential")
		if r.header.Get(HeaderTarget) != "lan" || cloud.Contains("plain words") {
			t.Fatalf("target %q", r.header.Get(HeaderTarget))
		}
	})
	t.Run("a secret is denied when no T0 target exists", func(t *testing.T) {
		r := post(t, chat, chatBody("key sk-proj-abcdefghijklmnopqrstuvwxyzABCDEF0123456789abcd"))
		if r.status != 503 || gjson.Get(r.body, "error.code").String() != "no_target_available" || r.header.Get("Retry-After") != "1" {
			t.Fatalf("status %d: %s", r.status, r.body)
		}
		want := "No allowed target is available for model `m` (lan: tier T1 not allowed by the policy; remote: tier T2 not allowed by the policy; cloud: tier T3 not allowed by the policy)."
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
		if r.status != 200 || gjson.Get(r.body, "data.0.embedding.#").Int() != 3 || gjson.Get(r.body, "model").String() != "gpt-up" {
			t.Fatalf("embeddings: %d %s", r.status, r.body)
		}
	})
	t.Run("the model list shows what the caller may reach", func(t *testing.T) {
		resp, err := http.Get(gw.URL + "/v1/models")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != 200 || string(b) != `{"object":"list","data":[{"id":"m","object":"model","created":0,"owned_by":"molly"}]}` {
			t.Fatalf("models: %d %s", resp.StatusCode, b)
		}
	})
}

func TestForwarderRestoresPlaceholdersInTheAnswer(t *testing.T) {
	_, _, cloud, targets := threeTiers(t)
	cls := NewClassifier(testScanner(t), map[string]Sensitivity{"EMAIL": Public})
	gw := startGateway(t, newCatalogue(t, targets...), cls, defaultEngine(t))
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

// sseContent joins the content deltas of an SSE body that ends with [DONE].
func sseContent(t *testing.T, body string) string {
	t.Helper()
	var b strings.Builder
	done := false
	for _, line := range strings.Split(body, "\n") {
		data, ok := strings.CutPrefix(line, "data: ")
		if !ok {
			continue
		}
		if data == "[DONE]" {
			done = true
			continue
		}
		b.WriteString(gjson.Get(data, "choices.0.delta.content").String())
	}
	if !done {
		t.Fatalf("stream without [DONE]: %s", body)
	}
	return b.String()
}

func TestForwarderFallsBack(t *testing.T) {
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
			targets := []*Target{
				{Name: "lan", Tier: "T1", Endpoint: lan.URL(), Models: []string{"m"}, Quality: map[string]float64{"default": 0.5}},
				{Name: "best", Tier: "T2", Endpoint: bad.URL + "/v1", Models: []string{"m"}, Quality: map[string]float64{"default": 0.9}},
			}
			gw := startGateway(t, newCatalogue(t, targets...), testClassifier(t), defaultEngine(t))
			r := post(t, gw.URL+"/v1/chat/completions", chatBody("hello"))
			if r.status != 200 || r.header.Get(HeaderTarget) != "lan" || gjson.Get(r.body, "choices.0.message.content").String() != "lan says: hello" {
				t.Fatalf("status %d target %q: %s", r.status, r.header.Get(HeaderTarget), r.body)
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
		targets := []*Target{
			{Name: "lan", Tier: "T1", Endpoint: lan.URL(), Models: []string{"m"}, Quality: map[string]float64{"default": 0.5}},
			{Name: "best", Tier: "T2", Endpoint: bad.URL + "/v1", Models: []string{"m"}, Quality: map[string]float64{"default": 0.9}},
		}
		gw := startGateway(t, newCatalogue(t, targets...), testClassifier(t), defaultEngine(t))
		r := post(t, gw.URL+"/v1/chat/completions", chatBody("hello"))
		if r.status != 400 || r.header.Get(HeaderTarget) != "best" || lan.Count() != 0 {
			t.Fatalf("status %d target %q", r.status, r.header.Get(HeaderTarget))
		}
	})
	t.Run("when every candidate fails the client gets 503 naming each", func(t *testing.T) {
		a, _ := failing(t, 500)
		b, _ := failing(t, 502)
		targets := []*Target{
			{Name: "a", Tier: "T1", Endpoint: a.URL + "/v1", Models: []string{"m"}, Quality: map[string]float64{"default": 0.9}},
			{Name: "b", Tier: "T2", Endpoint: b.URL + "/v1", Models: []string{"m"}, Quality: map[string]float64{"default": 0.5}},
		}
		gw := startGateway(t, newCatalogue(t, targets...), testClassifier(t), defaultEngine(t))
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
		targets := []*Target{
			{Name: "lan", Tier: "T1", Endpoint: bad.URL + "/v1", Models: []string{"m"}},
			{Name: "cloud", Tier: "T3", Endpoint: cloud.URL(), Models: []string{"m"}},
		}
		gw := startGateway(t, newCatalogue(t, targets...), testClassifier(t), defaultEngine(t))
		r := post(t, gw.URL+"/v1/chat/completions", chatBody("mail alice@example.com"))
		if r.status != 503 || cloud.Count() != 0 {
			t.Fatalf("status %d, cloud got %d requests", r.status, cloud.Count())
		}
	})
}

func TestForwarderStreams(t *testing.T) {
	lan := upstreamtest.Start("lan")
	t.Cleanup(lan.Close)
	lan.ChunkDelay = 100 * time.Millisecond
	targets := []*Target{{Name: "lan", Tier: "T1", Endpoint: lan.URL(), Models: []string{"m"}}}
	gw := startGateway(t, newCatalogue(t, targets...), testClassifier(t), defaultEngine(t))

	t.Run("chunks reach the client as they come", func(t *testing.T) {
		start := time.Now()
		resp, err := http.Post(gw.URL+"/v1/chat/completions", "application/json",
			strings.NewReader(`{"model":"m","stream":true,"messages":[{"role":"user","content":"one two three four"}]}`))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" || resp.Header.Get(HeaderTier) != "T1" {
			t.Fatalf("content type %q tier %q", ct, resp.Header.Get(HeaderTier))
		}
		br := bufio.NewReader(resp.Body)
		if _, err := br.ReadString('\n'); err != nil {
			t.Fatal(err)
		}
		first := time.Since(start)
		rest, _ := io.ReadAll(br)
		total := time.Since(start)
		if first > total-200*time.Millisecond {
			t.Fatalf("first chunk after %v, last after %v: the stream was buffered", first, total)
		}
		if !strings.HasSuffix(string(rest), "data: [DONE]\n\n") {
			t.Fatalf("stream end = %q", rest)
		}
	})
	t.Run("a truncated upstream stream ends in an error event, never [DONE]", func(t *testing.T) {
		r := post(t, gw.URL+"/v1/chat/completions", `{"model":"m","stream":true,"messages":[{"role":"user","content":"TRUNCATE please"}]}`)
		if r.status != 200 || !strings.HasSuffix(r.body, streamTruncated) || strings.Contains(r.body, "[DONE]") || strings.Contains(r.body, `"finish_reason":"stop"`) {
			t.Fatalf("status %d body %q", r.status, r.body)
		}
	})
}

// openAIHandler answers chat completions like OpenAI, in process. With
// "stream": true it sends one chunk per word of the last message, then
// waits for "go" on release before finishing (or for its context to end,
// which it reports on cancelled).
type openAIHandler struct {
	got       chan http.Header
	bodies    chan []byte
	release   chan struct{}
	cancelled chan struct{}
	panicking bool
}

// Models makes the handler an Engine serving "demo" and "demo:support".
func (h *openAIHandler) Models() []string { return []string{"demo", "demo:support"} }

func newOpenAIHandler() *openAIHandler {
	return &openAIHandler{got: make(chan http.Header, 16), bodies: make(chan []byte, 16),
		release: make(chan struct{}), cancelled: make(chan struct{}, 1)}
}

func (h *openAIHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if h.panicking {
		panic("engine bug")
	}
	body, _ := io.ReadAll(r.Body)
	h.got <- r.Header.Clone()
	h.bodies <- body
	if r.URL.Path != "/v1/chat/completions" {
		http.NotFound(w, r)
		return
	}
	words := strings.Fields(gjson.GetBytes(body, "messages.0.content").String())
	if !gjson.GetBytes(body, "stream").Bool() {
		w.Header().Set("Content-Type", "application/json")
		b, _ := json.Marshal(map[string]any{"id": "c", "object": "chat.completion", "model": gjson.GetBytes(body, "model").String(),
			"choices": []any{map[string]any{"index": 0, "finish_reason": "stop", "message": map[string]any{"role": "assistant", "content": strings.Join(words, "+")}}}})
		_, _ = w.Write(b)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.WriteHeader(200)
	for _, word := range words {
		fmt.Fprintf(w, "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":%q},\"finish_reason\":null}]}\n\n", word)
		w.(http.Flusher).Flush()
	}
	select {
	case <-h.release:
	case <-r.Context().Done():
		h.cancelled <- struct{}{}
		return
	case <-time.After(5 * time.Second):
		return
	}
	fmt.Fprint(w, "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n")
}

func engineGateway(t *testing.T, h Engine) *httptest.Server {
	t.Helper()
	targets := []*Target{{Name: "engine", Tier: "T0", Kind: KindEngine, Models: []string{"m=demo"}}}
	cat, err := NewCatalogue(targets, h)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cat.Close)
	return startGateway(t, cat, testClassifier(t), defaultEngine(t))
}

func TestEngineTargetInProcess(t *testing.T) {
	t.Run("a non-streaming answer comes back with the engine's headers", func(t *testing.T) {
		h := newOpenAIHandler()
		gw := engineGateway(t, h)
		r := post(t, gw.URL+"/v1/chat/completions", chatBody("key sk-proj-abcdefghijklmnopqrstuvwxyzABCDEF0123456789abcd"))
		if r.status != 200 || r.header.Get(HeaderTier) != "T0" || r.header.Get(HeaderTarget) != "engine" {
			t.Fatalf("status %d tier %q: %s", r.status, r.header.Get(HeaderTier), r.body)
		}
		if got := gjson.Get(r.body, "choices.0.message.content").String(); got != "key+sk-proj-abcdefghijklmnopqrstuvwxyzABCDEF0123456789abcd" {
			t.Fatalf("answer = %q", got)
		}
		hdr, body := <-h.got, <-h.bodies
		if hdr.Get("X-Molly-Decision-Id") != r.header.Get(HeaderDecisionID) || gjson.GetBytes(body, "model").String() != "demo" {
			t.Fatalf("engine got headers %v body %s", hdr, body)
		}
	})
	t.Run("a stream arrives chunk by chunk and ends with [DONE]", func(t *testing.T) {
		h := newOpenAIHandler()
		gw := engineGateway(t, h)
		resp, err := http.Post(gw.URL+"/v1/chat/completions", "application/json",
			strings.NewReader(`{"model":"m","stream":true,"messages":[{"role":"user","content":"alpha beta"}]}`))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		br := bufio.NewReader(resp.Body)
		// Both word chunks arrive while the handler is still waiting: nothing is buffered.
		for _, want := range []string{"alpha", "beta"} {
			line, err := br.ReadString('\n')
			if err != nil || gjson.Get(strings.TrimPrefix(line, "data: "), "choices.0.delta.content").String() != want {
				t.Fatalf("line = %q, %v; want the %s chunk", line, err, want)
			}
			_, _ = br.ReadString('\n')
		}
		close(h.release)
		rest, _ := io.ReadAll(br)
		if !strings.HasSuffix(string(rest), "data: [DONE]\n\n") {
			t.Fatalf("rest = %q", rest)
		}
	})
	t.Run("cancelling the client cancels the handler's context", func(t *testing.T) {
		h := newOpenAIHandler()
		gw := engineGateway(t, h)
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, gw.URL+"/v1/chat/completions",
			strings.NewReader(`{"model":"m","stream":true,"messages":[{"role":"user","content":"first"}]}`))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		if line, err := bufio.NewReader(resp.Body).ReadString('\n'); err != nil || !strings.Contains(line, "first") {
			t.Fatalf("first line = %q, %v", line, err)
		}
		cancel()
		select {
		case <-h.cancelled:
		case <-time.After(3 * time.Second):
			t.Fatal("the engine handler's context was not cancelled after the client went away")
		}
	})
	t.Run("an engine target without models serves the engine's models under their own names", func(t *testing.T) {
		h := newOpenAIHandler()
		targets := []*Target{{Name: "engine", Tier: "T0", Kind: KindEngine}}
		cat, err := NewCatalogue(targets, h)
		if err != nil {
			t.Fatal(err)
		}
		defer cat.Close()
		d := allowTiers(t, []string{"T0"}, nil)
		if got := cat.Models(d); !reflect.DeepEqual(got, []string{"demo", "demo:support"}) {
			t.Fatalf("Models = %q", got)
		}
		gw := startGateway(t, cat, testClassifier(t), defaultEngine(t))
		r := post(t, gw.URL+"/v1/chat/completions", `{"model":"demo:support","messages":[{"role":"user","content":"hi"}]}`)
		if r.status != 200 || gjson.GetBytes(<-h.bodies, "model").String() != "demo:support" {
			t.Fatalf("status %d: %s", r.status, r.body)
		}
		if r := post(t, gw.URL+"/v1/chat/completions", chatBody("hi")); r.status != 404 {
			t.Fatalf("a model the engine does not serve: status %d", r.status)
		}
	})
	t.Run("a panicking engine is a failed attempt, not a crash", func(t *testing.T) {
		h := newOpenAIHandler()
		h.panicking = true
		gw := engineGateway(t, h)
		r := post(t, gw.URL+"/v1/chat/completions", chatBody("hi"))
		want := "All allowed targets for model `m` failed (engine: HTTP 500 Internal Server Error)."
		if r.status != 503 || gjson.Get(r.body, "error.message").String() != want {
			t.Fatalf("status %d: %s", r.status, r.body)
		}
	})
}

func TestHandlerTransport(t *testing.T) {
	t.Run("a handler that writes nothing answers 200 with an empty body", func(t *testing.T) {
		rt := &handlerTransport{h: http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})}
		req := httptest.NewRequest(http.MethodPost, "http://engine.molly.internal/v1/chat/completions", nil)
		resp, err := rt.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || len(b) != 0 || err != nil {
			t.Fatalf("status %d body %q err %v", resp.StatusCode, b, err)
		}
	})
	t.Run("the status and headers the handler sets are the response's", func(t *testing.T) {
		rt := &handlerTransport{h: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("X-Test", "1")
			w.WriteHeader(http.StatusTeapot)
			_, _ = io.WriteString(w, "short and stout")
		})}
		resp, err := rt.RoundTrip(httptest.NewRequest(http.MethodGet, "http://engine.molly.internal/v1/models", nil))
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 418 || resp.Header.Get("X-Test") != "1" || string(b) != "short and stout" {
			t.Fatalf("status %d header %v body %q", resp.StatusCode, resp.Header, b)
		}
	})
	t.Run("a request cancelled before the header returns the context error", func(t *testing.T) {
		block := make(chan struct{})
		defer close(block)
		rt := &handlerTransport{h: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			select {
			case <-block:
			case <-r.Context().Done():
			}
		})}
		ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
		defer cancel()
		req := httptest.NewRequest(http.MethodGet, "http://engine.molly.internal/v1/models", nil).WithContext(ctx)
		if resp, err := rt.RoundTrip(req); err == nil || resp != nil {
			t.Fatalf("RoundTrip = %v, %v; want the deadline error", resp, err)
		}
	})
	t.Run("a panic after the header truncates the body with an error", func(t *testing.T) {
		rt := &handlerTransport{h: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			_, _ = io.WriteString(w, "partial")
			panic(http.ErrAbortHandler)
		})}
		resp, err := rt.RoundTrip(httptest.NewRequest(http.MethodGet, "http://engine.molly.internal/v1/models", nil))
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if string(b) != "partial" || err != io.ErrUnexpectedEOF {
			t.Fatalf("body %q err %v; want partial and unexpected EOF", b, err)
		}
	})
}

func TestDecisionContext(t *testing.T) {
	d := allowTiers(t, []string{"T0"}, nil)
	if DecisionFrom(WithDecision(t.Context(), d)) != d || DecisionFrom(t.Context()) != nil {
		t.Fatal("WithDecision/DecisionFrom do not round-trip")
	}
}
