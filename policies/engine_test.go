package policies

import (
	"context"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/tester"
)

// TestRegoPolicies runs every *_test.rego of the embedded policies through OPA's tester.
func TestRegoPolicies(t *testing.T) {
	mods := map[string]*ast.Module{}
	err := fs.WalkDir(Default, ".", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := fs.ReadFile(Default, path)
		if err != nil {
			return err
		}
		m, err := ast.ParseModule(path, string(b))
		if err != nil {
			return err
		}
		mods[path] = m
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	ch, err := tester.NewRunner().SetModules(mods).Run(context.Background(), mods)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for r := range ch {
		n++
		if !r.Pass() {
			t.Errorf("%s.%s: %s", r.Package, r.Name, r.String())
		}
	}
	if n < 10 {
		t.Fatalf("ran %d Rego tests, want at least 10", n)
	}
}

func input(class string, findings map[string]any) map[string]any {
	return map[string]any{
		"request":     map[string]any{"endpoint": "chat.completions", "model": "chat", "stream": false},
		"capability":  map[string]any{"task": "chat"},
		"sovereignty": map[string]any{"sensitivity": class, "detected": class, "declared": "public", "findings": findings, "opaque": false, "residency": ""},
		"identity":    map[string]any{"member": "anonymous"},
	}
}

func TestDefaultPolicyDecisions(t *testing.T) {
	e, err := New(context.Background(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name, class string
		findings    map[string]any
		tiers       []string
		redactT3    []string
	}{
		{"public goes anywhere with nothing to redact", "public", map[string]any{}, []string{"T0", "T1", "T2", "T3"}, []string{}},
		{"public with a finding redacts it for T3", "public", map[string]any{"EMAIL": 1}, []string{"T0", "T1", "T2", "T3"}, []string{"EMAIL"}},
		{"internal stops at T2", "internal", map[string]any{"PHONE": 1}, []string{"T0", "T1", "T2"}, nil},
		{"confidential stays on the LAN", "confidential", nil, []string{"T0", "T1"}, nil},
		{"restricted stays on device", "restricted", nil, []string{"T0"}, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			d := e.decideMap(context.Background(), input(c.class, c.findings))
			if !d.Allowed() || !slices.Equal(d.Tiers(), c.tiers) {
				t.Fatalf("allowed=%v tiers=%v reasons=%v, want tiers %v", d.Allowed(), d.Tiers(), d.Reasons(), c.tiers)
			}
			if got := d.Redact("T3"); !slices.Equal(got, c.redactT3) {
				t.Fatalf("redact T3 = %v, want %v", got, c.redactT3)
			}
			if len(d.ID()) != 36 {
				t.Fatalf("decision id %q is not a UUID", d.ID())
			}
		})
	}
}

func writePolicy(t *testing.T, dir, src string) {
	t.Helper()
	p := filepath.Join(dir, "p.rego")
	if err := os.WriteFile(p, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	// Make the edit visible to the fingerprint even within one mtime tick.
	future := time.Now().Add(time.Duration(len(src)) * time.Millisecond)
	_ = os.Chtimes(p, future, future)
}

func TestFailClosed(t *testing.T) {
	cases := []struct {
		name, src, reason string
	}{
		{"an undefined decision denies", "package molly.policy\nimport rego.v1\ndecision := 1 if { false }", "undefined"},
		{"a malformed decision denies", "package molly.policy\nimport rego.v1\ndecision := {\"allow\": \"yes\", \"tiers\": [\"T0\"]}", "malformed"},
		{"an unknown tier denies", "package molly.policy\nimport rego.v1\ndecision := {\"allow\": true, \"tiers\": [\"T9\"]}", "unknown tier"},
		{"an evaluation error denies", "package molly.policy\nimport rego.v1\ndecision := {\"allow\": true, \"tiers\": [\"T0\"], \"x\": to_number(\"nan!\")}", "evaluation failed"},
		{"a timeout denies", "package molly.policy\nimport rego.v1\nn := count([x | some x in numbers.range(1, 300000000)])\ndecision := {\"allow\": n > 0, \"tiers\": [\"T0\"]}", "timed out"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			writePolicy(t, dir, c.src)
			e, err := New(context.Background(), Options{Dir: dir, Timeout: 50 * time.Millisecond})
			if err != nil {
				t.Fatal(err)
			}
			d := e.decideMap(context.Background(), input("public", nil))
			if d.Allowed() || d.AllowsTier("T0") {
				t.Fatalf("allowed: %v", d.Tiers())
			}
			r := strings.Join(d.Reasons(), "; ")
			if !strings.Contains(r+" "+d.detail, c.reason) {
				t.Fatalf("reasons %q and detail %q do not mention %q", r, d.detail, c.reason)
			}
			if strings.Contains(r, "p.rego") || strings.Contains(r, "rego_") {
				t.Fatalf("reasons %q quote the policy's source or compiler errors to clients", r)
			}
		})
	}
}

func TestPolicyEditTakesEffectOnNextRequest(t *testing.T) {
	dir := t.TempDir()
	writePolicy(t, dir, "package molly.policy\nimport rego.v1\ndecision := {\"allow\": true, \"tiers\": [\"T0\", \"T3\"], \"reasons\": [\"v1\"]}")
	e, err := New(context.Background(), Options{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	if d := e.decideMap(context.Background(), input("public", nil)); !d.AllowsTier("T3") {
		t.Fatalf("v1 should allow T3: %v", d.Reasons())
	}
	writePolicy(t, dir, "package molly.policy\nimport rego.v1\ndecision := {\"allow\": true, \"tiers\": [\"T0\"], \"reasons\": [\"version two\"]}")
	d := e.decideMap(context.Background(), input("public", nil))
	if d.AllowsTier("T3") || !d.AllowsTier("T0") || d.Reasons()[0] != "version two" {
		t.Fatalf("edit not applied: tiers %v reasons %v", d.Tiers(), d.Reasons())
	}
	writePolicy(t, dir, "package molly.policy\nthis is not rego")
	d = e.decideMap(context.Background(), input("public", nil))
	if d.Allowed() || !strings.Contains(d.Reasons()[0], "failed to load") || strings.Contains(d.Reasons()[0], "p.rego") || !strings.Contains(d.detail, "p.rego") {
		t.Fatalf("broken edit must deny, with the compiler error in the log only: %v %v %q", d.Tiers(), d.Reasons(), d.detail)
	}
}

func TestBrokenPolicyRefusesToStart(t *testing.T) {
	dir := t.TempDir()
	writePolicy(t, dir, "package molly.policy\ndecision := {")
	if _, err := New(context.Background(), Options{Dir: dir}); err == nil || !strings.Contains(err.Error(), "p.rego") {
		t.Fatalf("want a compile error naming p.rego, got %v", err)
	}
}

func TestZeroDecisionAllowsNothing(t *testing.T) {
	var d Decision
	if d.Allowed() || d.AllowsTier("T0") {
		t.Fatal("zero Decision must allow nothing")
	}
}
