package pipeline

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/hashicorp/go-hclog"
	"github.com/tidwall/gjson"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/molly-gateway/molly/internal/upstreamtest"
	"github.com/molly-gateway/molly/plugins"
	"github.com/molly-gateway/molly/router/identity"
	"github.com/molly-gateway/molly/router/route"
)

// managerTools is ToolRunner on the real plugin manager, as the molly app
// wires it (caddy-modules/app/tools.go).
type managerTools struct{ m *plugins.Manager }

func (t managerTools) Tools() []ToolSpec {
	var out []ToolSpec
	for _, n := range t.m.Names() {
		d, err := t.m.Describe(n)
		if err != nil {
			continue
		}
		out = append(out, ToolSpec{Name: d.Name, Description: d.Description, Parameters: d.ArgsSchema, SideEffect: string(d.SideEffect), Result: d.ResultSchema})
	}
	return out
}

func (t managerTools) Invoke(ctx context.Context, name string, args []byte, member string, scopes []string, key string) ([]byte, error) {
	res, err := t.m.Invoke(ctx, name, plugins.Invocation{Args: args, Caller: plugins.Caller{Member: member, Scopes: scopes}, IdempotencyKey: key})
	if err != nil {
		te := plugins.AsToolError(err)
		return nil, &ToolError{Code: te.Code, Message: te.Message}
	}
	return res, nil
}

// startTools runs the real payments (money) and support (write) plugins,
// each on its own SQLite file.
func startTools(t *testing.T) managerTools {
	t.Helper()
	bins, dir := toolPlugins(t), t.TempDir()
	m, err := plugins.NewManager([]plugins.Config{
		{Name: "payments", Path: bins["payments"][0], SHA256: bins["payments"][1], Env: map[string]string{"MOLLY_PAYMENTS_DB": dir + "/payments.db"}},
		{Name: "support", Path: bins["support"][0], SHA256: bins["support"][1], Env: map[string]string{"MOLLY_SUPPORT_DB": dir + "/support.db"}},
	}, plugins.Options{Logger: hclog.NewNullLogger()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return managerTools{m}
}

// toolGateway serves the walk with the governed tools, the caller being
// id (member "alice" when nil), logging into an observer.
func toolGateway(t *testing.T, tools managerTools, id *identity.Identity, edit func(*Pipeline), targets ...*route.Target) (string, *Pipeline, *observer.ObservedLogs) {
	t.Helper()
	core, logs := observer.New(zap.InfoLevel)
	if id == nil {
		id = &identity.Identity{Member: "alice"}
	}
	gw, p := startGateway(t, setup{targets: targets, id: id, edit: func(p *Pipeline) {
		p.Tools, p.Strategies.Tools, p.Logger = tools, true, zap.New(core)
		if edit != nil {
			edit(p)
		}
	}})
	return gw.URL + "/v1/chat/completions", p, logs
}

// calls asks for call while the conversation holds fewer than n tool messages.
func calls(n int, call upstreamtest.ToolCall) func([]byte) []upstreamtest.ToolCall {
	return func(body []byte) []upstreamtest.ToolCall {
		if strings.Count(gjson.GetBytes(body, `messages.#.role`).Raw, `"tool"`) >= n {
			return nil
		}
		return []upstreamtest.ToolCall{call}
	}
}

func TestToolLoopRunsGovernedToolsAndAsksAgain(t *testing.T) {
	lan := upstreamtest.Start("lan")
	t.Cleanup(lan.Close)
	// The model makes the same call twice (a retry): the idempotency key,
	// decision id and call id, is the same, so one intent is made.
	lan.ToolCalls = calls(2, upstreamtest.ToolCall{ID: "call_1", Name: "payments", Arguments: `{"op":"create_intent","amount":500,"currency":"EUR","customer":"cust_42"}`})
	url, _, logs := toolGateway(t, startTools(t), nil, nil, &route.Target{Name: "lan", Tier: "T1", Endpoint: lan.URL(), Models: []string{"m"}})

	r := post(t, url, chatBody("charge 5 EUR"))
	if r.status != 200 || gjson.Get(r.body, "choices.0.message.content").Str != "lan says: charge 5 EUR" || r.header.Get(HeaderPlan) != "tools" {
		t.Fatalf("status %d strategy %q: %s", r.status, r.header.Get(HeaderPlan), r.body)
	}
	bodies := lan.Received()
	if len(bodies) != 3 {
		t.Fatalf("upstream got %d requests, want 3", len(bodies))
	}
	if names := gjson.GetBytes(bodies[0], "tools.#.function.name").Raw; names != `["payments","support"]` {
		t.Fatalf("offered tools = %s", names)
	}
	if p := gjson.GetBytes(bodies[0], `tools.0.function.parameters.properties.amount.type`).Str; p != "integer" {
		t.Fatalf("the payments parameters were not offered: %s", bodies[0])
	}
	msgs := gjson.GetBytes(bodies[1], "messages").Array()
	if len(msgs) != 3 || msgs[1].Get("role").Str != "assistant" || msgs[1].Get("tool_calls.0.id").Str != "call_1" ||
		msgs[2].Get("role").Str != "tool" || msgs[2].Get("tool_call_id").Str != "call_1" {
		t.Fatalf("second request messages = %s", gjson.GetBytes(bodies[1], "messages").Raw)
	}
	first, again := msgs[2].Get("content").Str, gjson.GetBytes(bodies[2], "messages.4.content").Str
	intent := gjson.Get(first, "intent.id").Str
	if !strings.HasPrefix(intent, "pi_") || gjson.Get(first, "intent.amount").Int() != 500 || gjson.Get(first, "intent.member").Str != "alice" {
		t.Fatalf("tool result %s", first)
	}
	if gjson.Get(again, "intent.id").Str != intent {
		t.Fatalf("the repeated call made another intent: %s", again)
	}
	audit := logs.FilterMessage("tool call").All()
	if len(audit) != 2 {
		t.Fatalf("%d audit lines, want 2", len(audit))
	}
	fields := audit[0].ContextMap()
	if fields["decision_id"] != r.header.Get(HeaderDecisionID) || fields["tool"] != "payments" || fields["member"] != "alice" ||
		fields["tier"] != "T1" || fields["tool_call_id"] != "call_1" || fields["allow"] != true || fields["outcome"] != "ok" {
		t.Fatalf("audit line = %v", fields)
	}
	for _, e := range logs.All() {
		if b, _ := json.Marshal(e.ContextMap()); strings.Contains(string(b), "cust_42") {
			t.Fatalf("a log line carries the raw arguments: %s", b)
		}
	}
}

func TestToolLoopPolicyDenialReachesTheModel(t *testing.T) {
	lan := upstreamtest.Start("lan")
	t.Cleanup(lan.Close)
	lan.ToolCalls = calls(1, upstreamtest.ToolCall{ID: "call_9", Name: "payments", Arguments: `{"op":"create_intent","amount":100001,"currency":"EUR","customer":"cust_42"}`})
	url, _, logs := toolGateway(t, startTools(t), nil, nil, &route.Target{Name: "lan", Tier: "T1", Endpoint: lan.URL(), Models: []string{"m"}})

	r := post(t, url, chatBody("charge 1000 EUR"))
	if r.status != 200 || gjson.Get(r.body, "choices.0.message.content").Str != "lan says: charge 1000 EUR" {
		t.Fatalf("status %d: %s", r.status, r.body)
	}
	bodies := lan.Received()
	if len(bodies) != 2 {
		t.Fatalf("upstream got %d requests, want 2", len(bodies))
	}
	content := gjson.GetBytes(bodies[1], "messages.2.content").Str
	if gjson.Get(content, "error.code").Str != "permission_denied" ||
		gjson.Get(content, "error.message").Str != "policy: amount 100001 is over the limit of 100000 minor units" {
		t.Fatalf("tool message = %s", content)
	}
	audit := logs.FilterMessage("tool call").All()
	if len(audit) != 1 || audit[0].ContextMap()["outcome"] != "denied" || audit[0].ContextMap()["allow"] != false {
		t.Fatalf("audit = %v", audit)
	}
}

// TestNoGovernedToolIsOfferedToAnExternalAPI: tools.rego's tool_offer
// keeps governed tools away from T3 models; a call such a model makes
// anyway is not run.
func TestNoGovernedToolIsOfferedToAnExternalAPI(t *testing.T) {
	cloud := upstreamtest.Start("cloud")
	t.Cleanup(cloud.Close)
	cloud.ToolCalls = calls(1, upstreamtest.ToolCall{ID: "call_1", Name: "payments", Arguments: `{"op":"balances"}`})
	url, _, logs := toolGateway(t, startTools(t), nil, nil, &route.Target{Name: "cloud", Tier: "T3", Endpoint: cloud.URL(), Models: []string{"m"}})
	r := post(t, url, chatBody("what are the balances?"))
	if r.status != 200 || gjson.Get(r.body, "choices.0.finish_reason").Str != "tool_calls" || gjson.Get(r.body, "choices.0.message.tool_calls.0.function.name").Str != "payments" {
		t.Fatalf("status %d: %s", r.status, r.body)
	}
	if cloud.Count() != 1 || gjson.GetBytes(cloud.Received()[0], "tools").Exists() || len(logs.FilterMessage("tool call").All()) != 0 {
		t.Fatalf("cloud got %d requests (%s); want one without tools and no tool run", cloud.Count(), cloud.Received()[0])
	}
}

func TestToolOffersFollowTheScopeAndTheHiddenList(t *testing.T) {
	tools := startTools(t)
	for _, tc := range []struct {
		name   string
		id     *identity.Identity
		hidden []string
		want   string
	}{
		{"every tool for an unscoped member", &identity.Identity{Member: "alice"}, nil, `["payments","support"]`},
		{"a tool scope offers only its tools", &identity.Identity{Member: "alice", Tools: []string{"supp*"}}, nil, `["support"]`},
		{"hidden tools are never offered", &identity.Identity{Member: "alice"}, []string{"payments"}, `["support"]`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lan := upstreamtest.Start("lan")
			t.Cleanup(lan.Close)
			url, _, _ := toolGateway(t, tools, tc.id, func(p *Pipeline) { p.ToolsHidden = tc.hidden },
				&route.Target{Name: "lan", Tier: "T1", Endpoint: lan.URL(), Models: []string{"m"}})
			if r := post(t, url, chatBody("hi")); r.status != 200 {
				t.Fatalf("status %d: %s", r.status, r.body)
			}
			if got := gjson.GetBytes(lan.Received()[0], "tools.#.function.name").Raw; got != tc.want {
				t.Fatalf("offered %s, want %s", got, tc.want)
			}
		})
	}
}

func TestToolLoopStepLimit(t *testing.T) {
	lan := upstreamtest.Start("lan")
	t.Cleanup(lan.Close)
	n := 0
	lan.ToolCalls = func([]byte) []upstreamtest.ToolCall {
		n++
		return []upstreamtest.ToolCall{{ID: "call_" + strings.Repeat("x", n), Name: "payments", Arguments: `{"op":"balances"}`}}
	}
	url, _, logs := toolGateway(t, startTools(t), nil, func(p *Pipeline) { p.Strategies.ToolSteps = 2 },
		&route.Target{Name: "lan", Tier: "T1", Endpoint: lan.URL(), Models: []string{"m"}})

	r := post(t, url, chatBody("look it up"))
	if r.status != http.StatusBadGateway || gjson.Get(r.body, "error.code").Str != "tool_steps_exceeded" {
		t.Fatalf("status %d: %s", r.status, r.body)
	}
	if got := len(logs.FilterMessage("tool call").All()); got != 2 {
		t.Fatalf("%d tool calls run, want 2", got)
	}
	if got := lan.Count(); got != 3 {
		t.Fatalf("upstream got %d requests, want 3", got)
	}
}

func TestToolLoopBoundsTheResultSize(t *testing.T) {
	lan := upstreamtest.Start("lan")
	t.Cleanup(lan.Close)
	lan.ToolCalls = calls(1, upstreamtest.ToolCall{ID: "call_1", Name: "payments", Arguments: `{"op":"create_intent","amount":500,"currency":"EUR","customer":"cust_42"}`})
	url, _, _ := toolGateway(t, startTools(t), nil, func(p *Pipeline) { p.Strategies.ToolResultTokens = 5 },
		&route.Target{Name: "lan", Tier: "T1", Endpoint: lan.URL(), Models: []string{"m"}})
	if r := post(t, url, chatBody("charge 5 EUR")); r.status != 200 {
		t.Fatalf("status %d: %s", r.status, r.body)
	}
	content := gjson.GetBytes(lan.Received()[1], "messages.2.content").Str
	if gjson.Get(content, "error.code").Str != "result_too_large" || gjson.Get(content, "error.message").Str != "the tool result is over 5 tokens" {
		t.Fatalf("tool message = %s", content)
	}
}

// TestToolLoopStopsWhenAResultIsMoreSensitive: every round is decided
// again; a tool result that raises the class above the one the
// conversation was decided at stops it (residency.rego), before the
// result reaches any model.
func TestToolLoopStopsWhenAResultIsMoreSensitive(t *testing.T) {
	remote := upstreamtest.Start("remote")
	t.Cleanup(remote.Close)
	remote.ToolCalls = calls(1, upstreamtest.ToolCall{ID: "call_1", Name: "support", Arguments: `{"op":"list"}`})
	tools := startTools(t)
	url, p, _ := toolGateway(t, tools, nil, nil, &route.Target{Name: "remote", Tier: "T2", Endpoint: remote.URL(), Models: []string{"m"}})
	// A ticket alice opened earlier, directly, holds an e-mail address.
	if _, reasons, te := p.CallTool(context.Background(), testClassifier(t), &identity.Identity{Member: "alice"}, "support",
		[]byte(`{"op":"create","subject":"refund","body":"write to bob@example.com"}`), "k-1"); te != nil {
		t.Fatalf("creating the ticket: %v (%v)", te, reasons)
	}

	r := post(t, url, chatBody("what are my tickets?"))
	if r.status != http.StatusForbidden || gjson.Get(r.body, "error.code").Str != "tool_result_too_sensitive" {
		t.Fatalf("status %d: %s", r.status, r.body)
	}
	if remote.Count() != 1 || remote.Contains("bob@example.com") {
		t.Fatalf("remote got %d requests (or the address)", remote.Count())
	}
}

func TestToolLoopLeavesRequestsWithTheirOwnTools(t *testing.T) {
	lan := upstreamtest.Start("lan")
	t.Cleanup(lan.Close)
	url, _, _ := toolGateway(t, startTools(t), nil, nil, &route.Target{Name: "lan", Tier: "T1", Endpoint: lan.URL(), Models: []string{"m"}})
	body := `{"model":"m","messages":[{"role":"user","content":"hi"}],"tools":[{"type":"function","function":{"name":"mine","parameters":{"type":"object"}}}]}`
	r := post(t, url, body)
	if r.status != 200 || r.header.Get(HeaderPlan) != "single" {
		t.Fatalf("status %d strategy %q: %s", r.status, r.header.Get(HeaderPlan), r.body)
	}
	if got := gjson.GetBytes(lan.Received()[0], "tools.#.function.name").Raw; got != `["mine"]` {
		t.Fatalf("tools sent = %s", got)
	}
}

func TestCallToolDirectly(t *testing.T) {
	_, p, logs := toolGateway(t, startTools(t), nil, nil, &route.Target{Name: "lan", Tier: "T1", Endpoint: "http://127.0.0.1:1/v1", Models: []string{"m"}})
	cls := testClassifier(t)
	alice := &identity.Identity{Member: "alice", Tools: []string{"support"}}
	res, _, te := p.CallTool(context.Background(), cls, alice, "support", []byte(`{"op":"create","subject":"hello"}`), "k-1")
	if te != nil || !strings.HasPrefix(gjson.GetBytes(res, "ticket.id").Str, "tk_") || gjson.GetBytes(res, "ticket.requester").Str != "alice" {
		t.Fatalf("CallTool = %s, %v", res, te)
	}
	if _, reasons, te := p.CallTool(context.Background(), cls, alice, "payments", []byte(`{"op":"balances"}`), "k-2"); te == nil || te.Code != "permission_denied" ||
		len(reasons) != 1 || reasons[0] != "tool payments is not in the tool scope of member alice" {
		t.Fatalf("a tool outside the scope: %v, %v", te, reasons)
	}
	if _, _, te := p.CallTool(context.Background(), cls, alice, "nope", []byte(`{}`), "k-3"); te == nil || te.Code != "not_found" {
		t.Fatalf("an unknown tool: %v", te)
	}
	if _, _, te := p.CallTool(context.Background(), cls, alice, "support", []byte(`[1]`), "k-4"); te == nil || te.Code != "invalid_argument" {
		t.Fatalf("arguments that are no object: %v", te)
	}
	audit := logs.FilterMessage("tool call").All()
	if len(audit) != 3 || audit[0].ContextMap()["target"] != DirectTarget || audit[0].ContextMap()["tier"] != DirectTier || audit[0].ContextMap()["tool_call_id"] != "k-1" {
		t.Fatalf("audit %v", audit)
	}
}
