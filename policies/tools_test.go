package policies

import (
	"context"
	"os"
	"path/filepath"
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
	e, err := New(context.Background(), Options{})
	if err != nil {
		t.Fatal(err)
	}
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
		if d.Allow != c.allow {
			t.Errorf("%s: allow = %v (%v), want %v", c.name, d.Allow, d.Reasons, c.allow)
		}
		if c.reason != "" && (len(d.Reasons) == 0 || d.Reasons[0] != c.reason) {
			t.Errorf("%s: reasons = %q, want %q first", c.name, d.Reasons, c.reason)
		}
	}
}

// TestDecideToolFailsClosed: a policy directory without tools.rego leaves
// tool_decision undefined, which denies.
func TestDecideToolFailsClosed(t *testing.T) {
	dir := t.TempDir()
	b, err := Default.ReadFile("residency.rego")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "residency.rego"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	b, _ = Default.ReadFile("redaction.rego")
	if err := os.WriteFile(filepath.Join(dir, "redaction.rego"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	e, err := New(context.Background(), Options{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	d := e.DecideTool(context.Background(), toolInput("read", "T0", nil))
	if d.Allow || len(d.Reasons) != 1 || d.Reasons[0] != "tool policy decision is undefined" {
		t.Fatalf("decision = %+v, want an undefined denial", d)
	}
}
