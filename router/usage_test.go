package router

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

	"github.com/tidwall/gjson"

	"github.com/molly-gateway/molly/api"
	"github.com/molly-gateway/molly/internal/upstreamtest"
)

// memLedger keeps recorded usage in memory.
type memLedger struct {
	mu  sync.Mutex
	got []Usage
}

func (l *memLedger) Record(_ context.Context, u Usage) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.got = append(l.got, u)
	return nil
}

func (l *memLedger) take() []Usage {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := l.got
	l.got = nil
	return out
}

// identityGateway is startGateway with an identity in the request context,
// as molly_auth puts it there.
func identityGateway(t *testing.T, cat *Catalogue, id *Identity) *httptest.Server {
	t.Helper()
	f := &Forwarder{Catalogue: cat, Weights: DefaultWeights}
	cls, eng := testClassifier(t), defaultEngine(t)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ep, _ := EndpointOf(r.Method, r.URL.Path)
		body, _ := io.ReadAll(r.Body)
		a, err := cls.Classify(ep, body, "", "")
		if err != nil {
			api.WriteError(w, err)
			return
		}
		if aerr := id.Check(a); aerr != nil {
			aerr.Write(w)
			return
		}
		ctx := WithIdentity(r.Context(), id)
		d := eng.DecideMap(ctx, PolicyInputFor(a, id, cat))
		if err := f.Serve(w, r.WithContext(ctx), a, d); err != nil {
			api.WriteError(w, err)
		}
	}))
	t.Cleanup(srv.Close)
	return srv
}

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

func TestForwarderRecordsUsage(t *testing.T) {
	up := upstreamtest.Start("up")
	t.Cleanup(up.Close)
	quiet := silent(t)
	cat := newCatalogue(t,
		&Target{Name: "reporting", Tier: "T2", Endpoint: up.URL(), Models: []string{"m"}, PriceIn: 1, PriceOut: 2},
		&Target{Name: "quiet", Tier: "T2", Endpoint: quiet.URL + "/v1", Models: []string{"q"}, PriceIn: 1000, PriceOut: 1000})
	ledger := &memLedger{}
	gw := identityGateway(t, cat, &Identity{Member: "alice", Ledger: ledger})
	// chatBody's prompt "hi there" is 2 tokens, +3 per message, +3 priming: 8.
	req := func(model, extra string) string {
		return `{"model":"` + model + `",` + extra + `"messages":[{"role":"user","content":"hi there"}]}`
	}
	tests := []struct {
		name                string
		body                string
		want                Usage
		clientSeesUsage     bool // a usage chunk reaches the client
		upstreamAskedForUse bool // the upstream was asked for stream usage
	}{
		{"a whole answer records the upstream's usage", req("m", ""),
			Usage{Member: "alice", Model: "m", Target: "reporting", Tier: "T2", PromptTokens: 5, CompletionTokens: 5, CostUSD: 15e-6}, false, false},
		{"a stream records the usage chunk Molly asked for and hides it from the client", req("m", `"stream":true,`),
			Usage{Member: "alice", Model: "m", Target: "reporting", Tier: "T2", PromptTokens: 5, CompletionTokens: 4, CostUSD: 13e-6}, false, true},
		{"a stream whose client asked for usage keeps the usage chunk", req("m", `"stream":true,"stream_options":{"include_usage":true},`),
			Usage{Member: "alice", Model: "m", Target: "reporting", Tier: "T2", PromptTokens: 5, CompletionTokens: 4, CostUSD: 13e-6}, true, true},
		{"a whole answer without usage is counted by Molly", req("q", ""),
			Usage{Member: "alice", Model: "q", Target: "quiet", Tier: "T2", PromptTokens: 8, CompletionTokens: 3, Estimated: true, CostUSD: 11e-3}, false, false},
		{"a stream without a usage chunk is counted over the streamed text", req("q", `"stream":true,`),
			Usage{Member: "alice", Model: "q", Target: "quiet", Tier: "T2", PromptTokens: 8, CompletionTokens: 3, Estimated: true, CostUSD: 11e-3}, false, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := up.Count()
			r := post(t, gw.URL+"/v1/chat/completions", tt.body, "X-Molly-Sensitivity", "internal")
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
			if seen := strings.Contains(r.body, `"usage"`); strings.Contains(tt.body, `"stream":true`) && seen != tt.clientSeesUsage {
				t.Fatalf("client sees usage: %v, want %v:\n%s", seen, tt.clientSeesUsage, r.body)
			}
			if strings.Contains(tt.body, `"stream":true`) && !strings.HasSuffix(r.body, "data: [DONE]\n\n") {
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
		anon := identityGateway(t, cat, nil)
		r := post(t, anon.URL+"/v1/chat/completions", req("m", `"stream":true,`))
		if r.status != 200 || strings.Contains(r.body, `"usage"`) || len(ledger.take()) != 0 {
			t.Fatalf("status %d, body:\n%s", r.status, r.body)
		}
	})
	t.Run("a failed upstream records nothing", func(t *testing.T) {
		r := post(t, gw.URL+"/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"FAIL500"}]}`)
		if r.status != 503 || len(ledger.take()) != 0 {
			t.Fatalf("status %d: %s", r.status, r.body)
		}
	})
}

func TestIdentityCheck(t *testing.T) {
	tools := `{"model":"gpt-4o","tools":[{"type":"function","function":{"name":"search"}},{"type":"function","function":{"name":"pay"}}],"messages":[{"role":"user","content":"hi"}]}`
	tests := []struct {
		name     string
		id       *Identity
		body     string
		wantCode string // "" allowed
	}{
		{"no identity allows everything", nil, chatBody("hi"), ""},
		{"an identity without scopes allows everything", &Identity{Member: "a"}, tools, ""},
		{"a model in scope is allowed", &Identity{Models: []string{"gpt-4o", "m"}}, tools, ""},
		{"a prefix scope allows the models it starts", &Identity{Models: []string{"gpt-*"}}, tools, ""},
		{"a model out of scope is refused", &Identity{Models: []string{"m"}}, tools, "model_not_allowed"},
		{"tools all in scope are allowed", &Identity{Tools: []string{"search", "pay"}}, tools, ""},
		{"one tool out of scope is refused", &Identity{Tools: []string{"search"}}, tools, "tool_not_allowed"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := classify(t, EndpointChat, tt.body, "")
			err := tt.id.Check(a)
			if tt.wantCode == "" {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			if err == nil || err.Status != 403 || err.Code != tt.wantCode {
				t.Fatalf("got %v, want 403 %s", err, tt.wantCode)
			}
		})
	}
}

func TestPolicyInputCarriesTheIdentity(t *testing.T) {
	a := classify(t, EndpointChat, chatBody("hi"), "")
	id := &Identity{Member: "alice", Models: []string{"m"}, Tiers: []string{"T0", "T1"}, Budgeted: true, RemainingUSD: 0.25}
	got := PolicyInputFor(a, id, nil)["identity"]
	want := map[string]any{"member": "alice", "scopes": []any{"model:m", "tier:T0", "tier:T1"},
		"models": []any{"m"}, "tiers": []any{"T0", "T1"}, "tools": []any{}, "remaining_usd": 0.25}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("identity = %v, want %v", got, want)
	}
	if got := PolicyInputFor(a, nil, nil)["identity"].(map[string]any)["member"]; got != "anonymous" {
		t.Fatalf("nil identity member = %v", got)
	}

	// The default policy intersects the decision's tiers with the identity's.
	e, cat := defaultEngine(t), newCatalogue(t, rankTargets()...)
	d := e.DecideMap(context.Background(), PolicyInputFor(a, id, cat))
	if !d.Allowed() || !reflect.DeepEqual(d.Tiers(), []string{"T0", "T1"}) {
		t.Fatalf("scoped decision tiers %v (reasons %v), want T0,T1", d.Tiers(), d.Reasons())
	}
}

func TestWithIdentity(t *testing.T) {
	if IdentityFrom(context.Background()) != nil {
		t.Fatal("identity from an empty context")
	}
	id := &Identity{Member: "a"}
	if IdentityFrom(WithIdentity(context.Background(), id)) != id {
		t.Fatal("identity lost")
	}
}

func TestModelListFollowsTheScope(t *testing.T) {
	up := upstreamtest.Start("up")
	t.Cleanup(up.Close)
	cat := newCatalogue(t, &Target{Name: "a", Tier: "T1", Endpoint: up.URL(), Models: []string{"gpt-4o", "gpt-4o-mini", "llama"}})
	tests := []struct {
		name string
		id   *Identity
		want []string
	}{
		{"without an identity every model is listed", nil, []string{"gpt-4o", "gpt-4o-mini", "llama"}},
		{"an identity without a model scope sees every model", &Identity{Member: "a"}, []string{"gpt-4o", "gpt-4o-mini", "llama"}},
		{"a model scope lists only its models", &Identity{Member: "a", Models: []string{"gpt-*", "other"}}, []string{"gpt-4o", "gpt-4o-mini"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			gw := identityGateway(t, cat, tt.id)
			resp, err := http.Get(gw.URL + "/v1/models")
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			var got []string
			for _, id := range gjson.GetBytes(b, "data.#.id").Array() {
				got = append(got, id.String())
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Fatalf("models %v, want %v (%s)", got, tt.want, b)
			}
		})
	}
}
