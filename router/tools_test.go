package router

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/tidwall/gjson"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/molly-gateway/molly/api"
	"github.com/molly-gateway/molly/internal/upstreamtest"
)

// fakeTools is a ToolRunner with a money tool "payments" and a read tool
// "lookup"; it records every invocation and answers result.
type fakeTools struct {
	result string
	mu     sync.Mutex
	calls  []fakeCall
}

type fakeCall struct{ name, args, member, key string }

func (f *fakeTools) Tools() []ToolSpec {
	return []ToolSpec{
		{Name: "payments", Description: "moves money", SideEffect: "money",
			Parameters: json.RawMessage(`{"type":"object","properties":{"amount":{"type":"integer"}}}`)},
		{Name: "lookup", Description: "reads", SideEffect: "read", Parameters: json.RawMessage(`{"type":"object"}`)},
	}
}

func (f *fakeTools) Invoke(_ context.Context, name string, args []byte, member string, _ []string, key string) ([]byte, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, fakeCall{name, string(args), member, key})
	if name == "lookup" && f.result == "" {
		return nil, &ToolError{Code: "not_found", Message: "nothing"}
	}
	return []byte(f.result), nil
}

func (f *fakeTools) invoked() []fakeCall {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]fakeCall(nil), f.calls...)
}

// toolGateway serves classify → default policy → Forwarder with tools, the
// caller being member "alice".
func toolGateway(t *testing.T, tools ToolRunner, steps int, targets ...*Target) (*httptest.Server, *observer.ObservedLogs) {
	t.Helper()
	core, logs := observer.New(zap.InfoLevel)
	cat, cls, eng := newCatalogue(t, targets...), testClassifier(t), defaultEngine(t)
	f := &Forwarder{Catalogue: cat, Weights: DefaultWeights, Logger: zap.New(core), Tools: tools, ToolPolicy: eng, ToolSteps: steps}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		a, err := cls.Classify(EndpointChat, body, "", "")
		if err != nil {
			api.WriteError(w, err)
			return
		}
		id := &Identity{Member: "alice"}
		d := eng.DecideMap(r.Context(), PolicyInputFor(a, id, cat))
		r = r.WithContext(WithIdentity(r.Context(), id))
		if err := f.Serve(w, r, a, d); err != nil {
			api.WriteError(w, err)
		}
	}))
	t.Cleanup(srv.Close)
	return srv, logs
}

// callOnce asks for call until the conversation holds a tool message.
func callOnce(call upstreamtest.ToolCall) func([]byte) []upstreamtest.ToolCall {
	return func(body []byte) []upstreamtest.ToolCall {
		if strings.Contains(gjson.GetBytes(body, `messages.#.role`).Raw, `"tool"`) {
			return nil
		}
		return []upstreamtest.ToolCall{call}
	}
}

func TestToolLoopRunsGovernedToolsAndAsksAgain(t *testing.T) {
	lan := upstreamtest.Start("lan")
	t.Cleanup(lan.Close)
	lan.ToolCalls = callOnce(upstreamtest.ToolCall{ID: "call_1", Name: "payments", Arguments: `{"amount":500,"currency":"EUR","customer":"cust_42"}`})
	tools := &fakeTools{result: `{"intent":{"id":"pi_1","status":"requires_capture"}}`}
	srv, logs := toolGateway(t, tools, 0, &Target{Name: "lan", Tier: "T1", Endpoint: lan.URL(), Models: []string{"m"}})

	r := post(t, srv.URL+"/v1/chat/completions", chatBody("charge 5 EUR"))
	if r.status != 200 || gjson.Get(r.body, "choices.0.message.content").Str != "lan says: charge 5 EUR" {
		t.Fatalf("status %d: %s", r.status, r.body)
	}
	id := r.header.Get(HeaderDecisionID)
	got := tools.invoked()
	want := fakeCall{"payments", `{"amount":500,"currency":"EUR","customer":"cust_42"}`, "alice", id + ":call_1"}
	if len(got) != 1 || got[0] != want {
		t.Fatalf("invocations = %+v, want [%+v]", got, want)
	}
	bodies := lan.Received()
	if len(bodies) != 2 {
		t.Fatalf("upstream got %d requests, want 2", len(bodies))
	}
	if names := gjson.GetBytes(bodies[0], "tools.#.function.name").Raw; names != `["lookup","payments"]` {
		t.Fatalf("offered tools = %s", names)
	}
	if p := gjson.GetBytes(bodies[0], "tools.1.function.parameters.properties.amount.type").Str; p != "integer" {
		t.Fatalf("payments parameters not offered: %s", bodies[0])
	}
	msgs := gjson.GetBytes(bodies[1], "messages").Array()
	if len(msgs) != 3 || msgs[1].Get("role").Str != "assistant" || msgs[1].Get("tool_calls.0.id").Str != "call_1" ||
		msgs[2].Get("role").Str != "tool" || msgs[2].Get("tool_call_id").Str != "call_1" ||
		msgs[2].Get("content").Str != `{"intent":{"id":"pi_1","status":"requires_capture"}}` {
		t.Fatalf("second request messages = %s", gjson.GetBytes(bodies[1], "messages").Raw)
	}
	audit := logs.FilterMessage("tool call").All()
	if len(audit) != 1 {
		t.Fatalf("%d audit lines, want 1", len(audit))
	}
	fields := audit[0].ContextMap()
	if fields["decision_id"] != id || fields["tool"] != "payments" || fields["member"] != "alice" || fields["allow"] != true || fields["outcome"] != "ok" {
		t.Fatalf("audit line = %v", fields)
	}
	for _, e := range logs.All() {
		if b, _ := json.Marshal(e.ContextMap()); strings.Contains(string(b), "cust_42") {
			t.Fatalf("a log line carries the raw arguments: %s", b)
		}
	}
}

func TestToolLoopPolicyDenialReachesTheModel(t *testing.T) {
	cloud := upstreamtest.Start("cloud")
	t.Cleanup(cloud.Close)
	cloud.ToolCalls = callOnce(upstreamtest.ToolCall{ID: "call_9", Name: "payments", Arguments: `{"amount":500,"currency":"EUR"}`})
	tools := &fakeTools{result: `{}`}
	srv, logs := toolGateway(t, tools, 0, &Target{Name: "cloud", Tier: "T3", Endpoint: cloud.URL(), Models: []string{"m"}})

	r := post(t, srv.URL+"/v1/chat/completions", chatBody("charge 5 EUR"))
	if r.status != 200 || gjson.Get(r.body, "choices.0.message.content").Str != "cloud says: charge 5 EUR" {
		t.Fatalf("status %d: %s", r.status, r.body)
	}
	if n := len(tools.invoked()); n != 0 {
		t.Fatalf("%d invocations, want none", n)
	}
	bodies := cloud.Received()
	if len(bodies) != 2 {
		t.Fatalf("upstream got %d requests, want 2", len(bodies))
	}
	content := gjson.GetBytes(bodies[1], "messages.2.content").Str
	if gjson.Get(content, "error.code").Str != "permission_denied" ||
		gjson.Get(content, "error.message").Str != "policy: money tool payments may not be called by a T3 model" {
		t.Fatalf("tool message = %s", content)
	}
	audit := logs.FilterMessage("tool call").All()
	if len(audit) != 1 || audit[0].ContextMap()["outcome"] != "denied" || audit[0].ContextMap()["allow"] != false {
		t.Fatalf("audit = %v", audit)
	}
}

func TestToolLoopStepLimit(t *testing.T) {
	lan := upstreamtest.Start("lan")
	t.Cleanup(lan.Close)
	n := 0
	lan.ToolCalls = func([]byte) []upstreamtest.ToolCall {
		n++
		return []upstreamtest.ToolCall{{ID: "call_" + strings.Repeat("x", n), Name: "lookup", Arguments: `{}`}}
	}
	tools := &fakeTools{result: `{"found":false}`}
	srv, _ := toolGateway(t, tools, 2, &Target{Name: "lan", Tier: "T1", Endpoint: lan.URL(), Models: []string{"m"}})

	r := post(t, srv.URL+"/v1/chat/completions", chatBody("look it up"))
	if r.status != http.StatusBadGateway || gjson.Get(r.body, "error.code").Str != "tool_steps_exceeded" {
		t.Fatalf("status %d: %s", r.status, r.body)
	}
	if got := len(tools.invoked()); got != 2 {
		t.Fatalf("%d invocations, want 2", got)
	}
	if got := lan.Count(); got != 3 {
		t.Fatalf("upstream got %d requests, want 3", got)
	}
}

func TestToolLoopStopsWhenAResultIsMoreSensitive(t *testing.T) {
	cloud := upstreamtest.Start("cloud")
	t.Cleanup(cloud.Close)
	cloud.ToolCalls = callOnce(upstreamtest.ToolCall{ID: "call_1", Name: "lookup", Arguments: `{}`})
	tools := &fakeTools{result: `{"email":"bob@example.com"}`}
	srv, _ := toolGateway(t, tools, 0, &Target{Name: "cloud", Tier: "T3", Endpoint: cloud.URL(), Models: []string{"m"}})

	r := post(t, srv.URL+"/v1/chat/completions", chatBody("who is bob?"))
	if r.status != http.StatusForbidden || gjson.Get(r.body, "error.code").Str != "tool_result_too_sensitive" {
		t.Fatalf("status %d: %s", r.status, r.body)
	}
	if cloud.Count() != 1 || cloud.Contains("bob@example.com") {
		t.Fatalf("cloud got %d requests (or the address)", cloud.Count())
	}
}

func TestToolLoopLeavesRequestsWithTheirOwnTools(t *testing.T) {
	lan := upstreamtest.Start("lan")
	t.Cleanup(lan.Close)
	tools := &fakeTools{result: `{}`}
	srv, _ := toolGateway(t, tools, 0, &Target{Name: "lan", Tier: "T1", Endpoint: lan.URL(), Models: []string{"m"}})
	body := `{"model":"m","messages":[{"role":"user","content":"hi"}],"tools":[{"type":"function","function":{"name":"mine","parameters":{"type":"object"}}}]}`
	r := post(t, srv.URL+"/v1/chat/completions", body)
	if r.status != 200 {
		t.Fatalf("status %d: %s", r.status, r.body)
	}
	if got := gjson.GetBytes(lan.Received()[0], "tools.#.function.name").Raw; got != `["mine"]` {
		t.Fatalf("tools sent = %s", got)
	}
}

func TestHiddenToolsAreNeverOfferedToModels(t *testing.T) {
	f := &Forwarder{Tools: &fakeTools{}, ToolsHidden: []string{"payments"}}
	got := f.offered(&Identity{Member: "alice"})
	if len(got) != 1 || got["lookup"].Name != "lookup" {
		t.Fatalf("offered %v, want only lookup", got)
	}
	f.ToolsHidden = nil
	if got := f.offered(&Identity{Member: "alice"}); len(got) != 2 {
		t.Fatalf("offered %v, want payments and lookup", got)
	}
}
