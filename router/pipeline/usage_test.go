package pipeline

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tidwall/gjson"

	"github.com/molly-gateway/molly/internal/upstreamtest"
	"github.com/molly-gateway/molly/router/classify"
	"github.com/molly-gateway/molly/router/identity"
	"github.com/molly-gateway/molly/router/meter"
	"github.com/molly-gateway/molly/router/openai"
	"github.com/molly-gateway/molly/router/route"
)

// silent is an upstream that never reports usage: it answers "hello world!"
// (3 estimated tokens), streamed in two chunks.
func silent(t *testing.T) *httptest.Server {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if !gjson.GetBytes(body, "stream").Bool() {
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, `{"id":"x","object":"chat.completion","choices":[{"index":0,"finish_reason":"stop","message":{"role":"assistant","content":"hello world!"}}]}`)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		for _, c := range []string{`{"content":"hello "}`, `{"content":"world!"}`} {
			fmt.Fprintf(w, "data: {\"id\":\"x\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":%s,\"finish_reason\":null}]}\n\n", c)
		}
		_, _ = io.WriteString(w, "data: {\"id\":\"x\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n")
	}))
	t.Cleanup(srv.Close)
	return srv
}

// usageTargets are "reporting" (an upstream that reports 5+5 tokens, or
// 5 + one per chunk on streams; 1 and 2 USD per 1M) serving "m", and
// "quiet" (never reports; 1000 USD per 1M both ways) serving "q".
func usageTargets(t *testing.T) (*upstreamtest.Upstream, []*route.Target) {
	up := upstreamtest.Start("up")
	t.Cleanup(up.Close)
	quiet := silent(t)
	return up, []*route.Target{
		{Name: "reporting", Tier: "T2", Endpoint: up.URL(), Models: []string{"m"}, PriceIn: 1, PriceOut: 2},
		{Name: "quiet", Tier: "T2", Endpoint: quiet.URL + "/v1", Models: []string{"q"}, PriceIn: 1000, PriceOut: 1000},
	}
}

// usageRequest asks model about "hi there": 2 tokens, +3 for the message, +3 for the reply: 8.
func usageRequest(model, extra string) string {
	return `{"model":"` + model + `",` + extra + `"messages":[{"role":"user","content":"hi there"}]}`
}

func TestRecordsUsage(t *testing.T) {
	up, targets := usageTargets(t)
	ledger := &memLedger{}
	url := chatURLFor(t, setup{targets: targets}, ledger)
	tests := []struct {
		name                string
		body                string
		want                meter.Usage
		clientSeesUsage     bool // a usage chunk reaches the client
		upstreamAskedForUse bool // the upstream was asked for stream usage
	}{
		{"a whole answer records the upstream's usage", usageRequest("m", ""),
			meter.Usage{Member: "alice", Model: "m", Target: "reporting", Tier: "T2", PromptTokens: 5, CompletionTokens: 5, CostUSD: 15e-6}, false, false},
		{"a stream records the usage chunk Molly asked for and hides it from the client", usageRequest("m", `"stream":true,`),
			meter.Usage{Member: "alice", Model: "m", Target: "reporting", Tier: "T2", PromptTokens: 5, CompletionTokens: 4, CostUSD: 13e-6}, false, true},
		{"a stream whose client asked for usage keeps the usage chunk", usageRequest("m", `"stream":true,"stream_options":{"include_usage":true},`),
			meter.Usage{Member: "alice", Model: "m", Target: "reporting", Tier: "T2", PromptTokens: 5, CompletionTokens: 4, CostUSD: 13e-6}, true, true},
		{"a whole answer without usage is counted by Molly", usageRequest("q", ""),
			meter.Usage{Member: "alice", Model: "q", Target: "quiet", Tier: "T2", PromptTokens: 8, CompletionTokens: 3, Estimated: true, CostUSD: 11e-3}, false, false},
		{"a stream without a usage chunk is counted over the streamed text", usageRequest("q", `"stream":true,`),
			meter.Usage{Member: "alice", Model: "q", Target: "quiet", Tier: "T2", PromptTokens: 8, CompletionTokens: 3, Estimated: true, CostUSD: 11e-3}, false, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := up.Count()
			r := post(t, url, tt.body, "X-Molly-Sensitivity", "internal")
			if r.status != 200 {
				t.Fatalf("status %d: %s", r.status, r.body)
			}
			got := ledger.take()
			if len(got) != 1 {
				t.Fatalf("recorded %d usages, want 1: %+v", len(got), got)
			}
			u := got[0]
			if u.DecisionID != r.header.Get(HeaderDecisionID) || u.Time.IsZero() {
				t.Fatalf("decision id %q (header %q), time %v", u.DecisionID, r.header.Get(HeaderDecisionID), u.Time)
			}
			u.DecisionID, u.Time = "", tt.want.Time
			if fmt.Sprintf("%.9f", u.CostUSD) != fmt.Sprintf("%.9f", tt.want.CostUSD) {
				t.Fatalf("cost %v, want %v", u.CostUSD, tt.want.CostUSD)
			}
			u.CostUSD = tt.want.CostUSD
			if !reflect.DeepEqual(u, tt.want) {
				t.Fatalf("recorded %+v\nwant     %+v", u, tt.want)
			}
			stream := strings.Contains(tt.body, `"stream":true`)
			if seen := strings.Contains(r.body, `"usage"`); stream && seen != tt.clientSeesUsage {
				t.Fatalf("client sees usage: %v, want %v:\n%s", seen, tt.clientSeesUsage, r.body)
			}
			if stream && !strings.HasSuffix(r.body, "data: [DONE]\n\n") {
				t.Fatalf("stream does not end with [DONE]:\n%s", r.body)
			}
			if up.Count() > before {
				asked := gjson.GetBytes(up.Received()[up.Count()-1], "stream_options.include_usage").Bool()
				if asked != tt.upstreamAskedForUse {
					t.Fatalf("upstream asked for stream usage: %v, want %v", asked, tt.upstreamAskedForUse)
				}
			}
		})
	}

	t.Run("a request without an identity records nothing and still hides the usage chunk", func(t *testing.T) {
		anon, _ := startGateway(t, setup{targets: targets})
		r := post(t, anon.URL+"/v1/chat/completions", usageRequest("m", `"stream":true,`))
		if r.status != 200 || strings.Contains(r.body, `"usage"`) || len(ledger.take()) != 0 {
			t.Fatalf("status %d, body:\n%s", r.status, r.body)
		}
	})
	t.Run("a failed upstream records nothing", func(t *testing.T) {
		r := post(t, url, `{"model":"m","messages":[{"role":"user","content":"FAIL500"}]}`)
		if r.status != 503 || len(ledger.take()) != 0 {
			t.Fatalf("status %d: %s", r.status, r.body)
		}
	})
}

// reservingLedger is a memLedger that is also a meter.Reserver: it notes
// what was reserved and released, and refuses with refuse when set.
type reservingLedger struct {
	memLedger
	mu       sync.Mutex
	refuse   *openai.Error
	tokens   []int
	usd      []float64
	released chan int // the usages recorded when each release came
}

func (l *reservingLedger) Reserve(_ context.Context, tokens int, expectedUSD float64) (func(), error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.refuse != nil {
		return nil, l.refuse
	}
	l.tokens, l.usd = append(l.tokens, tokens), append(l.usd, expectedUSD)
	return func() {
		l.memLedger.mu.Lock()
		n := len(l.memLedger.got)
		l.memLedger.mu.Unlock()
		l.released <- n
	}, nil
}

func TestReservesThePlansWorstCaseAndReleasesAfterRecording(t *testing.T) {
	_, targets := usageTargets(t)
	ledger := &reservingLedger{released: make(chan int, 4)}
	gw, _ := startGateway(t, setup{targets: targets, id: &identity.Identity{Member: "alice", Ledger: ledger}})
	url := gw.URL + "/v1/chat/completions"
	body := usageRequest("q", "") // 8 prompt tokens
	r := post(t, url, body, "X-Molly-Sensitivity", "internal")
	if r.status != 200 {
		t.Fatalf("status %d: %s", r.status, r.body)
	}
	if recorded := <-ledger.released; recorded != 1 {
		t.Fatalf("released with %d usages recorded, want after the 1", recorded)
	}
	ledger.mu.Lock()
	// The prompt at its bound (the body's bytes, one request's and one
	// message's allowance) + DefaultCompletionTokens (256), at 1000 USD/1M
	// tokens each.
	want := len(body) + classify.BoundPerRequest + classify.BoundPerMessage + 256
	if fmt.Sprint(ledger.tokens) != fmt.Sprintf("[%d]", want) || fmt.Sprintf("%.6f", ledger.usd[0]) != fmt.Sprintf("%.6f", float64(want)*1000/1e6) {
		t.Fatalf("reserved %v tokens, %v USD; want %d", ledger.tokens, ledger.usd, want)
	}
	ledger.refuse = &openai.Error{Status: http.StatusTooManyRequests, Type: "insufficient_quota", Code: "insufficient_quota", Message: "over budget"}
	ledger.mu.Unlock()
	ledger.take()
	r = post(t, url, body, "X-Molly-Sensitivity", "internal")
	if r.status != 429 || gjson.Get(r.body, "error.code").String() != "insufficient_quota" || len(ledger.take()) != 0 {
		t.Fatalf("refused reservation: status %d %s", r.status, r.body)
	}
}

// TestAClientThatGoesAwayIsBilledThePromptEstimate: in every strategy, a
// client that goes away once an upstream has the prompt, from upstreams
// that never answer, is billed its estimate for each upstream that had it
// when the call ends (a whole answer is waited for after the client left,
// within twice the target's timeout: its reported usage is what the
// upstream bills), and the reservation is released.
func TestAClientThatGoesAwayIsBilledThePromptEstimate(t *testing.T) {
	const flat = "Summarise and translate this text" // a mixture's prompt: 9 tokens + 6
	for _, tc := range []struct {
		name    string
		members int // upstreams asked at once
		prompt  string
		tokens  int
		edit    func(*Pipeline)
	}{
		// "hi there" is 8 prompt tokens.
		{"single", 1, "hi there", 8, nil},
		{"cascade", 1, "hi there", 8, func(p *Pipeline) { p.Strategies.Cascade = &route.Cascade{Threshold: -1} }},
		{"mixture", 2, flat, 15, func(p *Pipeline) { p.Strategies.Mixture = &route.Mixture{Entropy: route.DefaultMixtureEntropy} }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := make(chan struct{}, 2)
			slow := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				_, _ = io.ReadAll(r.Body) // then the server notices the connection closing
				got <- struct{}{}
				<-r.Context().Done()
			}))
			t.Cleanup(slow.Close)
			ledger := &reservingLedger{released: make(chan int, 1), memLedger: memLedger{recorded: make(chan meter.Usage, 2)}}
			gw, _ := startGateway(t, setup{targets: []*route.Target{
				{Name: "slow", Tier: "T2", Endpoint: slow.URL + "/v1", Models: []string{"q"}, PriceIn: 1000, PriceOut: 1000, TimeoutMS: 2000},
				{Name: "slower", Tier: "T2", Endpoint: slow.URL + "/v1", Models: []string{"q"}, PriceIn: 1000, PriceOut: 1000, TimeoutMS: 2000},
			}, id: &identity.Identity{Member: "alice", Ledger: ledger}, edit: tc.edit})

			ctx, cancel := context.WithCancel(context.Background())
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, gw.URL+"/v1/chat/completions",
				strings.NewReader(`{"model":"q","messages":[{"role":"user","content":"`+tc.prompt+`"}]}`))
			req.Header.Set("X-Molly-Sensitivity", "internal")
			done := make(chan error, 1)
			go func() {
				resp, err := http.DefaultClient.Do(req)
				if err == nil {
					resp.Body.Close()
				}
				done <- err
			}()
			for range tc.members { // the upstreams have the prompt
				select {
				case <-got:
				case <-time.After(10 * time.Second):
					t.Fatalf("fewer than %d upstreams got the prompt", tc.members)
				}
			}
			cancel()
			if err := <-done; err == nil {
				t.Fatal("the request finished instead of being cancelled")
			}
			for range tc.members {
				var u meter.Usage
				select {
				case u = <-ledger.recorded:
				case <-time.After(10 * time.Second):
					t.Fatal("no usage was recorded")
				}
				// The prompt at 1000 USD per 1M tokens.
				if u.Member != "alice" || !strings.HasPrefix(u.Target, "slow") || u.Tier != "T2" || u.PromptTokens != tc.tokens || u.CompletionTokens != 0 ||
					!u.Estimated || u.CostUSD != float64(tc.tokens)*1000/1e6 || u.DecisionID == "" {
					t.Fatalf("recorded %+v", u)
				}
			}
			select {
			case <-ledger.released:
			case <-time.After(10 * time.Second):
				t.Fatal("the reservation was not released")
			}
			if extra := ledger.take(); len(extra) != tc.members {
				t.Fatalf("%d usages recorded, want %d", len(extra), tc.members)
			}
		})
	}
}

// TestScopesAreDecidedInRego: a member's model and tool scopes are rules
// of the default policy (residency.rego); a request outside them is a 403
// with the rule's code, and nothing is sent.
func TestScopesAreDecidedInRego(t *testing.T) {
	up := upstreamtest.Start("up")
	t.Cleanup(up.Close)
	targets := []*route.Target{{Name: "a", Tier: "T1", Endpoint: up.URL(), Models: []string{"gpt-4o", "m"}}}
	tools := `{"model":"gpt-4o","tools":[{"type":"function","function":{"name":"search"}},{"type":"function","function":{"name":"pay"}}],"messages":[{"role":"user","content":"hi"}]}`
	tests := []struct {
		name     string
		id       *identity.Identity
		body     string
		wantCode string // "" allowed
	}{
		{"no identity allows everything", nil, tools, ""},
		{"an identity without scopes allows everything", &identity.Identity{Member: "a"}, tools, ""},
		{"a model in scope is allowed", &identity.Identity{Member: "a", Models: []string{"gpt-4o", "m"}}, tools, ""},
		{"a prefix scope allows the models it starts", &identity.Identity{Member: "a", Models: []string{"gpt-*"}}, tools, ""},
		{"a model out of scope is refused", &identity.Identity{Member: "a", Models: []string{"m"}}, tools, "model_not_allowed"},
		{"tools all in scope are allowed", &identity.Identity{Member: "a", Tools: []string{"search", "pay"}}, tools, ""},
		{"one tool out of scope is refused", &identity.Identity{Member: "a", Tools: []string{"search"}}, tools, "tool_not_allowed"},
		{"a tier scope outside the class refuses", &identity.Identity{Member: "a", Tiers: []string{"T3"}}, chatBody("card 4111 1111 1111 1111"), "policy_denied"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			gw, _ := startGateway(t, setup{targets: targets, id: tt.id})
			before := up.Count()
			r := post(t, gw.URL+"/v1/chat/completions", tt.body)
			if tt.wantCode == "" {
				if r.status != 200 {
					t.Fatalf("refused: %d %s", r.status, r.body)
				}
				return
			}
			if r.status != 403 || gjson.Get(r.body, "error.code").String() != tt.wantCode || gjson.Get(r.body, "error.type").String() != "policy_denied" ||
				gjson.Get(r.body, "error.decision_id").String() != r.header.Get(HeaderDecisionID) || up.Count() != before {
				t.Fatalf("got %d %s; want 403 %s and nothing sent", r.status, r.body, tt.wantCode)
			}
		})
	}
}

func TestModelListFollowsTheScope(t *testing.T) {
	up := upstreamtest.Start("up")
	t.Cleanup(up.Close)
	targets := []*route.Target{{Name: "a", Tier: "T1", Endpoint: up.URL(), Models: []string{"gpt-4o", "gpt-4o-mini", "llama"}}}
	tests := []struct {
		name string
		id   *identity.Identity
		want []string
	}{
		{"without an identity every model is listed", nil, []string{"gpt-4o", "gpt-4o-mini", "llama"}},
		{"an identity without a model scope sees every model", &identity.Identity{Member: "a"}, []string{"gpt-4o", "gpt-4o-mini", "llama"}},
		{"a model scope lists only its models", &identity.Identity{Member: "a", Models: []string{"gpt-*", "other"}}, []string{"gpt-4o", "gpt-4o-mini"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			gw, _ := startGateway(t, setup{targets: targets, id: tt.id})
			r := get(t, gw.URL+"/v1/models")
			var got []string
			for _, id := range gjson.Get(r.body, "data.#.id").Array() {
				got = append(got, id.String())
			}
			if r.status != 200 || !reflect.DeepEqual(got, tt.want) {
				t.Fatalf("models %v, want %v (%d %s)", got, tt.want, r.status, r.body)
			}
		})
	}
	t.Run("a model outside the scope is not found by its path", func(t *testing.T) {
		gw, _ := startGateway(t, setup{targets: targets, id: &identity.Identity{Member: "a", Models: []string{"gpt-*"}}})
		if r := get(t, gw.URL+"/v1/models/llama"); r.status != 404 {
			t.Fatalf("status %d: %s", r.status, r.body)
		}
		if r := get(t, gw.URL+"/v1/models/gpt-4o"); r.status != 200 || gjson.Get(r.body, "id").String() != "gpt-4o" {
			t.Fatalf("status %d: %s", r.status, r.body)
		}
	})
}
