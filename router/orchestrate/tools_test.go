package orchestrate

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/hashicorp/go-hclog"
	"github.com/tidwall/gjson"

	"github.com/molly-gateway/molly/plugins"
	"github.com/molly-gateway/molly/router/identity"
	"github.com/molly-gateway/molly/router/pipeline"
	"github.com/molly-gateway/molly/router/route"
)

// managerTools is pipeline.ToolRunner on the real plugin manager, as the
// molly app wires it (caddy-modules/app/tools.go).
type managerTools struct{ m *plugins.Manager }

func (t managerTools) Tools() []pipeline.ToolSpec {
	var out []pipeline.ToolSpec
	for _, n := range t.m.Names() {
		if d, err := t.m.Describe(n); err == nil {
			out = append(out, pipeline.ToolSpec{Name: d.Name, Description: d.Description, Parameters: d.ArgsSchema, SideEffect: string(d.SideEffect), Result: d.ResultSchema})
		}
	}
	return out
}

func (t managerTools) Invoke(ctx context.Context, name string, args []byte, member string, scopes []string, key string) ([]byte, error) {
	res, err := t.m.Invoke(ctx, name, plugins.Invocation{Args: args, Caller: plugins.Caller{Member: member, Scopes: scopes}, IdempotencyKey: key})
	if err != nil {
		te := plugins.AsToolError(err)
		return nil, &pipeline.ToolError{Code: te.Code, Message: te.Message}
	}
	return res, nil
}

// startPayments builds and runs the real payments plugin.
func startPayments(t *testing.T) managerTools {
	t.Helper()
	dir := t.TempDir()
	out, err := exec.Command("go", "build", "-o", dir+string(filepath.Separator), "../../plugins/payments").CombinedOutput()
	if err != nil {
		t.Fatalf("building the payments plugin: %v\n%s", err, out)
	}
	bin := filepath.Join(dir, "payments")
	b, err := os.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(b)
	m, err := plugins.NewManager([]plugins.Config{{Name: "payments", Path: bin, SHA256: hex.EncodeToString(sum[:]),
		Env: map[string]string{"MOLLY_PAYMENTS_DB": filepath.Join(dir, "payments.db")}}}, plugins.Options{Logger: hclog.NewNullLogger()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return managerTools{m}
}

func TestToolSubtasksRunGovernedToolsUnderTheToolPolicy(t *testing.T) {
	if testing.Short() {
		t.Skip("testing.Short: builds and starts the payments plugin")
	}
	tools := startPayments(t)
	_, ctl := controllerAnswering(t, `{"subtasks": [
		{"id": "pay", "instruction": "Create the intent.", "specialist": {"tool": "payments", "arguments": {"op": "create_intent", "amount": 500, "currency": "EUR", "customer": "cust_1"}}},
		{"id": "big", "instruction": "Create a large intent.", "specialist": {"tool": "payments", "arguments": {"op": "create_intent", "amount": 900000, "currency": "EUR", "customer": "cust_1"}}},
		{"id": "tell", "instruction": "Tell the user.", "specialist": {"model": "m"}, "depends_on": ["pay"], "inputs": ["subtask:pay"]}],
		"compose": {"mode": "sections", "order": ["tell", "big"]}}`)
	spec := startScripted(t, "spec")
	g := startGateway(t, setup{targets: []*route.Target{ctl, target("spec", "T1", spec.url(), 0.5, "m")}, cfg: Config{Controller: "planner"},
		id: &identity.Identity{Member: "alice"}, edit: func(p *pipeline.Pipeline) { p.Tools = tools }})
	r := post(t, t.Context(), g.url, chat("m", "Charge 5 EUR and tell me."), HeaderMode, ModeOrchestrate)
	if r.status != http.StatusOK {
		t.Fatalf("status %d: %s", r.status, r.body)
	}
	rec := g.record(t, r)
	pay, big := subtaskOf(rec, "pay"), subtaskOf(rec, "big")
	if pay.Get("outcome").String() != OutcomeOK || pay.Get("tier").String() != "T0" || big.Get("outcome").String() != OutcomeFailed ||
		!strings.Contains(big.Get("error").String(), "permission_denied") || !strings.Contains(big.Get("error").String(), "over the limit") {
		t.Errorf("pay %s, big %s: want pay run (decided for the T0 controller) and big denied over the money limit", pay.Raw, big.Raw)
	}
	tell := lastUser(spec.received()[0].body)
	if !strings.Contains(tell, `"id":"pi_`) {
		t.Errorf("the dependent subtask did not read the tool result: %q", tell)
	}
	audit := g.logs.FilterMessage("tool call").All()
	if len(audit) != 2 {
		t.Fatalf("%d tool audit lines, want 2", len(audit))
	}
	f := audit[0].ContextMap()
	if f["decision_id"] != rec.Get("decision_id").String() || !strings.HasPrefix(f["tool_call_id"].(string), rec.Get("id").String()+":") || f["target"] != "ctl" || f["member"] != "alice" {
		t.Errorf("audit line %v", f)
	}
	if u := r.header.Get(HeaderUncertainty); !strings.Contains(u, "big: no answer: tool error permission_denied") {
		t.Errorf("%s = %q, want the denied tool call reported", HeaderUncertainty, u)
	}
	if got := gjson.Get(r.body, "choices.0.message.content").String(); !strings.Contains(got, "spec: ") {
		t.Errorf("answer %q", got)
	}
}

func TestAPlanWithAToolOutsideTheMembersScopeIsDenied(t *testing.T) {
	if testing.Short() {
		t.Skip("testing.Short: builds and starts the payments plugin")
	}
	tools := startPayments(t)
	_, ctl := controllerAnswering(t, `{"subtasks": [{"id": "pay", "instruction": "Pay.", "specialist": {"tool": "payments", "arguments": {"op": "create_intent", "amount": 5, "currency": "EUR", "customer": "c"}}}]}`)
	g := startGateway(t, setup{targets: []*route.Target{ctl}, cfg: Config{Controller: "planner"},
		id: &identity.Identity{Member: "bob", Tools: []string{"support"}}, edit: func(p *pipeline.Pipeline) { p.Tools = tools }})
	r := post(t, t.Context(), g.url, chat("planner", "Charge 5 cents."), HeaderMode, ModeOrchestrate)
	if r.status != http.StatusForbidden || gjson.Get(r.body, "error.reasons.0").String() != "subtask pay: member bob may not use the tool payments" {
		t.Errorf("status %d: %s, want 403 naming the tool scope", r.status, r.body)
	}
}
