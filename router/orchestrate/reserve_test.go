package orchestrate

import (
	"context"
	"encoding/json"
	"io"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/tidwall/gjson"

	"github.com/molly-gateway/molly/internal/upstreamtest"
	"github.com/molly-gateway/molly/policies"
	"github.com/molly-gateway/molly/registry"
	"github.com/molly-gateway/molly/router/identity"
	"github.com/molly-gateway/molly/router/keyauth"
	"github.com/molly-gateway/molly/router/meter"
	"github.com/molly-gateway/molly/router/pipeline"
	"github.com/molly-gateway/molly/router/route"
)

// permissivePolicy is the embedded default policies with the two rules
// that deny a plan whose worst case is over its own budget taken out, as
// an operator may edit them.
func permissivePolicy(t *testing.T) *policies.Engine {
	t.Helper()
	dir := t.TempDir()
	err := fs.WalkDir(policies.Default, ".", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".rego") || strings.HasSuffix(path, "_test.rego") {
			return err
		}
		b, err := fs.ReadFile(policies.Default, path)
		if err != nil {
			return err
		}
		if filepath.Base(path) == "orchestration.rego" {
			src := string(b)
			for _, rule := range []string{
				"orchestration_denials contains sprintf(\"the plan's worst case of %v USD is over its budget of %v USD\", [input.metrics.worst_case.cost_usd, input.plan.budget.max_cost_usd]) if {\n\tinput.metrics.worst_case.cost_usd > input.plan.budget.max_cost_usd\n}\n",
				"orchestration_denials contains sprintf(\"the plan's worst case of %d tokens is over its budget of %d tokens\", [input.metrics.worst_case.tokens, input.plan.budget.max_tokens]) if {\n\tinput.metrics.worst_case.tokens > input.plan.budget.max_tokens\n}\n",
			} {
				if !strings.Contains(src, rule) {
					t.Fatalf("orchestration.rego no longer has the rule %q", rule)
				}
				src = strings.Replace(src, rule, "", 1)
			}
			b = []byte(src)
		}
		return os.WriteFile(filepath.Join(dir, filepath.Base(path)), b, 0o600)
	})
	if err != nil {
		t.Fatal(err)
	}
	e, err := policies.New(t.Context(), policies.Options{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// fullLength is a specialist that spends all it may: every answer is
// max_completion_tokens long, with usage saying so. It counts what it
// answered: the test's oracle.
type fullLength struct {
	srv        *httptest.Server
	mu         sync.Mutex
	completion int
}

func startFullLength(t *testing.T) *fullLength {
	f := &fullLength{}
	f.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		n := int(max(gjson.GetBytes(body, "max_completion_tokens").Int(), gjson.GetBytes(body, "max_tokens").Int()))
		f.mu.Lock()
		f.completion += n
		f.mu.Unlock()
		b, _ := json.Marshal(map[string]any{"id": "chatcmpl-x", "object": "chat.completion", "created": 1, "model": "m",
			"choices": []any{map[string]any{"index": 0, "finish_reason": "stop", "message": map[string]any{"role": "assistant", "content": "bonjour"}}},
			"usage":   map[string]any{"prompt_tokens": 0, "completion_tokens": n, "total_tokens": n}})
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(b)
	}))
	t.Cleanup(f.srv.Close)
	return f
}

// TestAPlanIsReservedAtItsWorstCaseWhateverItsBudgetSays: a controller's
// plan whose budget (1e-6 USD, 10 tokens) is far under its worst case (one subtask of
// 400 completion tokens at 30 USD/1M: 0.012 USD), under a policy that does
// not deny such plans, is reserved at its worst case: a member with 0.005
// USD left is refused with the ledger's 429 before any subtask runs, where
// reserving the plan's budget would have let the subtask spend 0.012 USD
// of a 0.005 USD budget.
func TestAPlanIsReservedAtItsWorstCaseWhateverItsBudgetSays(t *testing.T) {
	reg, err := registry.Open(filepath.Join(t.TempDir(), "molly.db"), registry.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { reg.Close() })
	const budget = 0.005
	m, _, err := reg.PutMember(t.Context(), registry.Member{Name: "alice", BudgetUSD: budget})
	if err != nil {
		t.Fatal(err)
	}
	_, ctl := controllerAnswering(t, `{"budget": {"max_cost_usd": 0.000001, "max_tokens": 10}, "subtasks": [
		{"id": "a", "instruction": "Do it.", "specialist": {"model": "m"}, "budget": {"max_tokens": 400}}]}`)
	spec := startFullLength(t)
	priced := target("cloud", "T3", spec.srv.URL+"/v1", 0.9, "m")
	priced.PriceIn, priced.PriceOut = 10, 30 // USD per 1M tokens
	id := &identity.Identity{Member: "alice", Budgeted: true, RemainingUSD: budget, Ledger: &keyauth.Ledger{Registry: reg, Member: m}}
	g := startGateway(t, setup{targets: []*route.Target{ctl, priced}, cfg: Config{Controller: "planner"}, id: id, policy: permissivePolicy(t)})
	r := post(t, t.Context(), g.url, chat("m", "Translate hello into French."), HeaderMode, ModeOrchestrate)
	spec.mu.Lock()
	spentUSD := float64(spec.completion) * 30 / 1e6
	spec.mu.Unlock()
	if spentUSD > budget {
		t.Errorf("the specialist answered %.6f USD for a member with %.3f USD", spentUSD, budget)
	}
	if r.status != http.StatusTooManyRequests || gjson.Get(r.body, "error.code").String() != "insufficient_quota" || gjson.Get(r.body, "error.type").String() != "insufficient_quota" {
		t.Fatalf("status %d: %s, want the ledger's 429 insufficient_quota", r.status, r.body)
	}
}

// noteLedger reserves whatever it is asked and notes it: what the
// orchestrator and the pipeline held for the request.
type noteLedger struct {
	mu     sync.Mutex
	tokens []int
}

func (l *noteLedger) Record(context.Context, meter.Usage) error { return nil }

func (l *noteLedger) Reserve(_ context.Context, tokens int, _ float64) (func(), error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.tokens = append(l.tokens, tokens)
	return func() {}, nil
}

// bulkyTool is a governed read tool whose every result is result.
type bulkyTool struct{ result []byte }

func (b bulkyTool) Tools() []pipeline.ToolSpec {
	return []pipeline.ToolSpec{{Name: "lookup", Description: "Looks a customer record up by id and returns all of it.", SideEffect: "read",
		Parameters: json.RawMessage(`{"type":"object","properties":{"id":{"type":"string"}},"required":["id"]}`)}}
}

func (b bulkyTool) Invoke(context.Context, string, []byte, string, []string, string) ([]byte, error) {
	return b.result, nil
}

// TestASubtasksToolRoundsHoldWhatTheyMayCost: a model subtask with tools
// whose model calls three tools at once gets three results of nearly the
// result bound — more than the plan's worst case assumed for its one tool
// round. The controller's reservation covers its call, and the plan's with
// what the subtask's rounds held past it (on the caller's ledger, through
// RunDerived) covers the subtask: the worst each upstream could bill for
// what it was sent, a token per byte of each request and its
// max_completion_tokens.
func TestASubtasksToolRoundsHoldWhatTheyMayCost(t *testing.T) {
	ctl, ctlTarget := controllerAnswering(t, `{"subtasks": [
		{"id": "look", "instruction": "Look the customers up.", "specialist": {"model": "m", "tools": true}, "budget": {"max_tokens": 64}}]}`)
	spec := upstreamtest.Start("spec")
	t.Cleanup(spec.Close)
	spec.ToolCalls = func(body []byte) []upstreamtest.ToolCall {
		if strings.Contains(gjson.GetBytes(body, "messages.#.role").Raw, `"tool"`) {
			return nil
		}
		return []upstreamtest.ToolCall{{ID: "call_1", Name: "lookup", Arguments: `{"id":"1"}`},
			{ID: "call_2", Name: "lookup", Arguments: `{"id":"2"}`}, {ID: "call_3", Name: "lookup", Arguments: `{"id":"3"}`}}
	}
	result := []byte(`{"record":"` + strings.Repeat("x", route.DefaultToolResultTokens-64) + `"}`)
	ledger := &noteLedger{}
	g := startGateway(t, setup{targets: []*route.Target{ctlTarget, target("spec", "T1", spec.URL(), 0.5, "m")}, cfg: Config{Controller: "planner"},
		id: &identity.Identity{Member: "alice", Ledger: ledger},
		edit: func(p *pipeline.Pipeline) {
			p.Tools, p.Strategies.Tools, p.Strategies.ToolSteps = bulkyTool{result}, true, 1
		}})
	r := post(t, t.Context(), g.url, chat("m", "Look up customers 1, 2 and 3."), HeaderMode, ModeOrchestrate)
	if r.status != http.StatusOK {
		t.Fatalf("status %d: %s", r.status, r.body)
	}
	bodies := spec.Received()
	if len(bodies) != 2 || strings.Count(string(bodies[1]), `"tool_call_id"`) != 3 {
		t.Fatalf("the specialist got %d requests, want a round of three calls and the answer", len(bodies))
	}
	worst := func(bodies ...[]byte) int {
		n := 0
		for _, b := range bodies {
			n += len(b) + int(max(gjson.GetBytes(b, "max_completion_tokens").Int(), gjson.GetBytes(b, "max_tokens").Int()))
		}
		return n
	}
	var planning [][]byte
	for _, c := range ctl.received() {
		planning = append(planning, c.body)
	}
	ledger.mu.Lock()
	defer ledger.mu.Unlock()
	// The controller's call holds its own reservation, first; the plan's
	// and what its subtask held past it follow.
	if len(ledger.tokens) < 2 || ledger.tokens[0] < worst(planning...) {
		t.Fatalf("held %v; the planning call may cost %d", ledger.tokens, worst(planning...))
	}
	held := 0
	for _, n := range ledger.tokens[1:] {
		held += n
	}
	if held < worst(bodies...) {
		t.Fatalf("held %d tokens (%v) for a subtask that may cost %d", held, ledger.tokens[1:], worst(bodies...))
	}
}
