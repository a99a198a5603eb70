package policies

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

func toolInput(effect, tier string, amount any) map[string]any {
	in := map[string]any{
		"tool":      map[string]any{"name": "payments", "side_effect": effect},
		"arguments": map[string]any{"findings": map[string]any{}, "sensitivity": "public"},
		"identity":  map[string]any{"member": "alice", "scopes": []any{}, "tools": []any{}},
		"tier":      tier,
	}
	if amount != nil {
		in["amount_minor"], in["currency"] = amount, "EUR"
	}
	return in
}

func TestDecideTool(t *testing.T) {
	e := defaultEngine(t)
	for _, c := range []struct {
		name   string
		in     map[string]any
		allow  bool
		reason string
	}{
		{"money from T1 under the limit", toolInput("money", "T1", 5000), true, ""},
		{"money from T3", toolInput("money", "T3", 5000), false, "money tool payments may not be called by a T3 model"},
		{"money over the limit", toolInput("money", "T2", 100001), false, "amount 100001 is over the limit of 100000 minor units"},
		{"read from T3", toolInput("read", "T3", nil), true, ""},
		{"empty input", map[string]any{}, false, "the tool call input is incomplete"},
	} {
		d := e.DecideTool(context.Background(), c.in)
		if d.Allow != c.allow || (d.Code == "") != c.allow || len(d.ID) != 36 || d.Revision != e.Status().Revision {
			t.Errorf("%s: allow = %v code %q (%v) id %q, want %v", c.name, d.Allow, d.Code, d.Reasons, d.ID, c.allow)
		}
		if c.reason != "" && (len(d.Reasons) == 0 || d.Reasons[0] != c.reason) {
			t.Errorf("%s: reasons = %q, want %q first", c.name, d.Reasons, c.reason)
		}
	}
}

func TestDecideToolOffer(t *testing.T) {
	e := defaultEngine(t)
	offer := func(tier string, scope []string) map[string]any {
		return map[string]any{"tool": map[string]any{"name": "support", "side_effect": "write"},
			"identity": map[string]any{"member": "alice", "tools": scope}, "tier": tier}
	}
	for _, c := range []struct {
		name   string
		in     map[string]any
		allow  bool
		reason string
	}{
		{"offered to a LAN model", offer("T1", nil), true, ""},
		{"offered to a self-hosted remote model", offer("T2", []string{"supp*"}), true, ""},
		{"not offered to an external model", offer("T3", nil), false, "tool support is not offered to T3 models"},
		{"not offered outside the member's scope", offer("T0", []string{"search"}), false, "tool support is not in the tool scope of member alice"},
		{"not offered on an empty input", map[string]any{}, false, "the tool offer input is incomplete"},
	} {
		d := e.DecideToolOffer(context.Background(), c.in)
		if d.Allow != c.allow || len(d.ID) != 36 {
			t.Errorf("%s: allow = %v (%v), want %v", c.name, d.Allow, d.Reasons, c.allow)
		}
		if c.reason != "" && !slices.Contains(d.Reasons, c.reason) {
			t.Errorf("%s: reasons = %q, want %q among them", c.name, d.Reasons, c.reason)
		}
	}
}

func escalationInput(kind string, score any, answers int, remaining []any) map[string]any {
	return map[string]any{
		"attempt": map[string]any{"target": "lan", "tier": "T1", "model": "small", "score": score, "score_kind": kind,
			"tokens": 20, "status": 200, "answers": answers, "max_attempts": 3},
		"threshold":  -1.0,
		"remaining":  remaining,
		"request":    map[string]any{"endpoint": "chat.completions", "model": "chat"},
		"capability": map[string]any{"task": "chat"},
	}
}

func TestDecideEscalation(t *testing.T) {
	e := defaultEngine(t)
	next := []any{map[string]any{"target": "cloud", "tier": "T3", "model": "big", "cost_usd": 0.002, "quality": 0.9}}
	for _, c := range []struct {
		name     string
		in       map[string]any
		escalate bool
	}{
		{"a low log-probability escalates", escalationInput("logprob", -2.25, 1, next), true},
		{"a low self-check escalates", escalationInput("selfcheck", -1.5, 2, next), true},
		{"a confident answer is returned", escalationInput("logprob", -0.5, 1, next), false},
		{"an unscored answer is returned", escalationInput("none", nil, 1, next), false},
		{"the last allowed attempt is returned", escalationInput("logprob", -2.25, 3, next), false},
		{"nothing left to try", escalationInput("logprob", -2.25, 1, []any{}), false},
	} {
		d := e.DecideEscalation(context.Background(), c.in)
		if d.Escalate != c.escalate || len(d.Reasons) == 0 || len(d.ID) != 36 || d.Revision == "" {
			t.Errorf("%s: escalate = %v (%v), want %v", c.name, d.Escalate, d.Reasons, c.escalate)
		}
	}
}

// copyDefaults writes the named embedded policies into dir.
func copyDefaults(t *testing.T, dir string, names ...string) {
	t.Helper()
	for _, n := range names {
		b, err := Default.ReadFile(n)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, n), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// TestToolRulesFailClosed: a policy directory without tools.rego and
// escalation.rego leaves their rules undefined, which denies tools and does
// not escalate.
func TestToolRulesFailClosed(t *testing.T) {
	dir := t.TempDir()
	copyDefaults(t, dir, "residency.rego", "redaction.rego")
	e, err := New(context.Background(), Options{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Close() })
	d := e.DecideTool(context.Background(), toolInput("read", "T0", nil))
	if d.Allow || d.Code != CodePolicyError || len(d.Reasons) != 1 || d.Reasons[0] != "tool policy decision is undefined" {
		t.Fatalf("decision = %+v, want an undefined denial", d)
	}
	o := e.DecideToolOffer(context.Background(), map[string]any{"tool": map[string]any{"name": "x", "side_effect": "read"}, "tier": "T0"})
	if o.Allow || o.Code != CodePolicyError {
		t.Fatalf("offer = %+v, want an undefined denial", o)
	}
	x := e.DecideEscalation(context.Background(), escalationInput("logprob", -5, 1, []any{map[string]any{"target": "c"}}))
	if x.Escalate || len(x.Reasons) != 1 || x.Reasons[0] != "escalation policy decision is undefined; the answer in hand is returned" {
		t.Fatalf("escalation = %+v, want no escalation", x)
	}
}
