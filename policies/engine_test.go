package policies

import (
	"context"
	"crypto/sha256"
	"encoding/json"
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
	if n < 60 {
		t.Fatalf("ran %d Rego tests, want at least 60", n)
	}
}

// subject is a test Subject: an input's request, capability and
// sovereignty members, with a digest over their JSON.
type subject struct {
	members map[string]any
	digest  Digest
}

func newSubject(members map[string]any) subject {
	b, _ := json.Marshal(members)
	return subject{members: members, digest: sha256.Sum256(b)}
}

func (s subject) Digest() Digest              { return s.digest }
func (s subject) PolicyInput() map[string]any { return s.members }

// valueSubject also offers the ast fast path.
type valueSubject struct {
	subject
	v ast.Value
}

func (s valueSubject) PolicyValue() ast.Value { return s.v }

func members(class string, findings map[string]any) map[string]any {
	return map[string]any{
		"request":     map[string]any{"endpoint": "chat.completions", "model": "chat", "stream": false},
		"capability":  map[string]any{"task": "chat", "modalities": []any{"text"}, "prompt_tokens": 12, "max_tokens": 0, "tools": false},
		"sovereignty": map[string]any{"sensitivity": class, "detected": class, "declared": "public", "findings": findings, "opaque": false, "scan_failed": false, "residency": ""},
	}
}

func routeIn(class string, findings map[string]any) Input {
	return Input{Subject: newSubject(members(class, findings)), Identity: map[string]any{"member": "anonymous", "scopes": []any{}}}
}

func defaultEngine(t testing.TB) *Engine {
	t.Helper()
	e, err := New(context.Background(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	return e
}

func TestDefaultPolicyDecisions(t *testing.T) {
	e := defaultEngine(t)
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
			in := routeIn(c.class, c.findings)
			got := e.Decide(context.Background(), in)
			d := got.Decision()
			if !got.Binds(in.Subject) || !d.Allowed() || !slices.Equal(d.Tiers(), c.tiers) || d.Code() != "" {
				t.Fatalf("binds=%v allowed=%v tiers=%v code=%q reasons=%v, want tiers %v", got.Binds(in.Subject), d.Allowed(), d.Tiers(), d.Code(), d.Reasons(), c.tiers)
			}
			if got := d.Redact("T3"); !slices.Equal(got, c.redactT3) {
				t.Fatalf("redact T3 = %v, want %v", got, c.redactT3)
			}
			if len(d.ID()) != 36 || d.Revision() != e.Status().Revision || d.Sensitivity() != c.class {
				t.Fatalf("id %q revision %q sensitivity %q", d.ID(), d.Revision(), d.Sensitivity())
			}
		})
	}
}

func TestTheValueFastPathDecidesLikeTheMapPath(t *testing.T) {
	e := defaultEngine(t)
	m := members("public", map[string]any{"EMAIL": 2})
	v, err := ValueOf(m)
	if err != nil {
		t.Fatal(err)
	}
	s := valueSubject{subject: newSubject(m), v: v}
	id := map[string]any{"member": "alice", "tiers": []string{"T0", "T3"}}
	a := e.Decide(context.Background(), Input{Subject: s, Identity: id}).Decision()
	b := e.Decide(context.Background(), Input{Subject: s.subject, Identity: id}).Decision()
	if !slices.Equal(a.Tiers(), []string{"T0", "T3"}) || !slices.Equal(a.Tiers(), b.Tiers()) ||
		!slices.Equal(a.Reasons(), b.Reasons()) || !slices.Equal(a.Redact("T3"), []string{"EMAIL"}) {
		t.Fatalf("value path %v %v, map path %v %v", a.Tiers(), a.Reasons(), b.Tiers(), b.Reasons())
	}
}

func TestADecisionBindsOnlyItsSubject(t *testing.T) {
	e := defaultEngine(t)
	in := routeIn("public", nil)
	d := e.Decide(context.Background(), in)
	other := newSubject(members("public", map[string]any{"EMAIL": 1}))
	if !d.Binds(in.Subject) || d.Binds(other) || d.Binds(nil) || d.Digest() != in.Subject.Digest() {
		t.Fatalf("binds own %v, other %v, nil %v", d.Binds(in.Subject), d.Binds(other), d.Binds(nil))
	}
	var zero Decided
	if zero.Binds(in.Subject) || zero.Decision().Allowed() || zero.Decision().AllowsTier("T0") || zero.Decision().Code() != CodePolicyDenied {
		t.Fatal("the zero Decided must bind and allow nothing")
	}
}

func TestIncompleteInputDenies(t *testing.T) {
	e := defaultEngine(t)
	d := e.Decide(context.Background(), Input{}).Decision()
	if d.Allowed() || d.Code() != CodePolicyError {
		t.Fatalf("nil subject: allowed=%v code=%q", d.Allowed(), d.Code())
	}
	in := routeIn("public", nil)
	in.Identity = map[string]any{"member": struct{ Name string }{"x"}}
	d = e.Decide(context.Background(), in).Decision()
	if d.Allowed() || d.Code() != CodePolicyError || !strings.Contains(d.detail, "input.identity") {
		t.Fatalf("struct in identity: allowed=%v code=%q detail=%q", d.Allowed(), d.Code(), d.detail)
	}
}

func TestScopeAndToolRoundDenialsCarryTheirCode(t *testing.T) {
	e := defaultEngine(t)
	scoped := func(m map[string]any, models, tools []string) Input {
		return Input{Subject: newSubject(m), Identity: map[string]any{"member": "alice", "models": models, "tools": tools}}
	}
	withTools := members("public", nil)
	withTools["request"] = map[string]any{"endpoint": "chat.completions", "model": "chat", "tools": []string{"search", "shell"}}
	raised := members("confidential", map[string]any{"IBAN": 1})
	cases := []struct {
		name string
		in   Input
		code string
	}{
		{"a model outside the scope", scoped(members("public", nil), []string{"gpt-*"}, nil), CodeModelNotAllowed},
		{"a declared tool outside the scope", scoped(withTools, nil, []string{"search"}), CodeToolNotAllowed},
		{"a tool round that raised the class", Input{Subject: newSubject(raised), Derived: map[string]any{
			"kind": "tool_round", "parent": map[string]any{"decision_id": "p", "sensitivity": "internal", "findings": map[string]int{"EMAIL": 1}}}}, CodeToolResultTooSensitive},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			d := e.Decide(context.Background(), c.in).Decision()
			if d.Allowed() || d.AllowsTier("T0") || d.Code() != c.code || len(d.Reasons()) != 1 {
				t.Fatalf("allowed=%v code=%q reasons=%v, want code %s", d.Allowed(), d.Code(), d.Reasons(), c.code)
			}
		})
	}
}

func TestOutputRules(t *testing.T) {
	d := defaultEngine(t).Decide(context.Background(), routeIn("public", nil)).Decision()
	t3, t1 := d.Output("T3"), d.Output("T1")
	if !t3.Masks("EMAIL") || !t3.Masks("PERSON") || t3.Blocks("EMAIL") || t1.Masks("EMAIL") || t1.Blocks("EMAIL") {
		t.Fatalf("T3 %+v, T1 %+v: want T3 masking every type, T1 passing", t3, t1)
	}
	r := OutputRule{Mask: []string{"*"}, Block: []string{"SECRET"}}
	if r.Masks("SECRET") || !r.Blocks("SECRET") || !r.Masks("EMAIL") {
		t.Fatalf("block must win over mask: %+v", r)
	}
}

func writePolicy(t *testing.T, dir, src string) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(dir, "p.rego"), []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestFailClosed(t *testing.T) {
	cases := []struct {
		name, src, code, reason string
	}{
		{"an undefined decision denies", "package molly.policy\nimport rego.v1\ndecision := 1 if { false }", CodePolicyError, "undefined"},
		{"a malformed decision denies", "package molly.policy\nimport rego.v1\ndecision := {\"allow\": \"yes\", \"tiers\": [\"T0\"]}", CodePolicyError, "malformed"},
		{"an unknown tier denies", "package molly.policy\nimport rego.v1\ndecision := {\"allow\": true, \"tiers\": [\"T9\"]}", CodePolicyError, "unknown tier"},
		{"a malformed output rule denies", "package molly.policy\nimport rego.v1\ndecision := {\"allow\": true, \"tiers\": [\"T0\"], \"output\": {\"T0\": [\"EMAIL\"]}}", CodePolicyError, "output"},
		{"a non-string code denies", "package molly.policy\nimport rego.v1\ndecision := {\"allow\": false, \"tiers\": [], \"code\": 7}", CodePolicyError, "code"},
		{"an evaluation error denies", "package molly.policy\nimport rego.v1\ndecision := {\"allow\": true, \"tiers\": [\"T0\"], \"x\": to_number(\"nan!\")}", CodePolicyError, "evaluation failed"},
		{"a denial without a code is policy_denied", "package molly.policy\nimport rego.v1\ndecision := {\"allow\": false, \"tiers\": [], \"reasons\": [\"closed\"]}", CodePolicyDenied, "closed"},
		{"an allowed decision without tiers denies", "package molly.policy\nimport rego.v1\ndecision := {\"allow\": true, \"tiers\": []}", CodePolicyDenied, ""},
		{"the policy's own code is kept", "package molly.policy\nimport rego.v1\ndecision := {\"allow\": false, \"tiers\": [], \"code\": \"after_hours\", \"reasons\": [\"closed at night\"]}", "after_hours", "night"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			writePolicy(t, dir, c.src)
			e, err := New(context.Background(), Options{Dir: dir})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = e.Close() })
			d := e.Decide(context.Background(), routeIn("public", nil)).Decision()
			if d.Allowed() || d.AllowsTier("T0") || d.Code() != c.code {
				t.Fatalf("allowed %v code %q, want a denial with code %q", d.Tiers(), d.Code(), c.code)
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

func TestBrokenPolicyRefusesToStart(t *testing.T) {
	dir := t.TempDir()
	writePolicy(t, dir, "package molly.policy\ndecision := {")
	if _, err := New(context.Background(), Options{Dir: dir}); err == nil || !strings.Contains(err.Error(), "p.rego") {
		t.Fatalf("want a compile error naming p.rego, got %v", err)
	}
	if _, err := New(context.Background(), Options{Dir: t.TempDir()}); err == nil || !strings.Contains(err.Error(), "no policy file") {
		t.Fatalf("an empty directory: want an error, got %v", err)
	}
}

func TestZeroDecisionAllowsNothing(t *testing.T) {
	var d Decision
	if d.Allowed() || d.AllowsTier("T0") || d.Code() != CodePolicyDenied {
		t.Fatal("zero Decision must allow nothing")
	}
	var nilD *Decision
	if nilD.Allowed() || nilD.ID() != "" || nilD.Tiers() != nil || nilD.Output("T3").Masks("EMAIL") {
		t.Fatal("nil Decision must allow nothing")
	}
}

func TestTheDeprecatedMapPathStillDecides(t *testing.T) {
	e := defaultEngine(t)
	in := members("internal", map[string]any{"EMAIL": 1})
	in["identity"] = map[string]any{"member": "anonymous"}
	d := e.DecideMap(context.Background(), in)
	if !d.Allowed() || !slices.Equal(d.Tiers(), []string{"T0", "T1", "T2"}) || d.Revision() == "" {
		t.Fatalf("tiers %v reasons %v", d.Tiers(), d.Reasons())
	}
}

// waitFor waits until cond holds or the deadline passes, re-checking after
// every reload notification.
func waitFor(t *testing.T, reloads <-chan Status, what string, cond func() bool) {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for !cond() {
		select {
		case <-reloads:
		case <-deadline:
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}
