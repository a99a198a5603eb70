// Package policytest makes real policy engines for tests: the embedded
// default policies, or the defaults with the route decision replaced by a
// literal one, so a test gets exactly the decision it needs from real OPA
// (and real contract checks) without a policy that reads it from input.
package policytest

import (
	"context"
	"encoding/json"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/molly-gateway/molly/policies"
)

// Default is the engine of the embedded default policies (policies/*.rego).
func Default(tb testing.TB) *policies.Engine {
	tb.Helper()
	e, err := policies.New(context.Background(), policies.Options{})
	if err != nil {
		tb.Fatalf("policies.New: %v", err)
	}
	return e
}

// LiteralQuery is the route decision rule of a Literal engine.
const LiteralQuery = "data.molly.test.decision"

// Literal is an engine whose route decision is always decision (a JSON
// object in the shape of docs/architecture.md, written into a Rego module as a
// literal), with a fresh decision id per evaluation. The other rules
// (tools, tool offers, escalation) are the embedded defaults.
func Literal(tb testing.TB, decision map[string]any) *policies.Engine {
	tb.Helper()
	dir := tb.TempDir()
	err := fs.WalkDir(policies.Default, ".", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".rego") || strings.HasSuffix(path, "_test.rego") {
			return err
		}
		b, err := fs.ReadFile(policies.Default, path)
		if err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(dir, filepath.Base(path)), b, 0o600)
	})
	if err != nil {
		tb.Fatal(err)
	}
	lit, err := json.Marshal(decision)
	if err != nil {
		tb.Fatal(err)
	}
	src := "package molly.test\n\nimport rego.v1\n\ndecision := " + string(lit) + "\n"
	if err := os.WriteFile(filepath.Join(dir, "zz_literal.rego"), []byte(src), 0o600); err != nil {
		tb.Fatal(err)
	}
	e, err := policies.New(context.Background(), policies.Options{Dir: dir, Query: LiteralQuery})
	if err != nil {
		tb.Fatalf("policies.New: %v", err)
	}
	return e
}

// Allow is a decision allowing tiers, redacting redact[tier], with extra
// members (e.g. "regions", "max_cost_usd") added.
func Allow(tiers []string, redact map[string][]string, extra map[string]any) map[string]any {
	ts := make([]any, len(tiers))
	for i, t := range tiers {
		ts[i] = t
	}
	rd := map[string]any{}
	for tier, types := range redact {
		l := make([]any, len(types))
		for i, ty := range types {
			l[i] = ty
		}
		rd[tier] = l
	}
	m := map[string]any{"allow": true, "tiers": ts, "redact": rd, "reasons": []any{"test"}}
	for k, v := range extra {
		m[k] = v
	}
	return m
}

// Decide asks e about s with no identity and no targets.
func Decide(tb testing.TB, e *policies.Engine, s policies.Subject) policies.Decided {
	tb.Helper()
	return e.Decide(context.Background(), policies.Input{Subject: s})
}
