package router

import (
	"context"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/molly-gateway/molly/policies"
	"github.com/molly-gateway/molly/redaction"
)

// The scanner compiles every detector pattern once; tests share it.
var (
	scannerOnce sync.Once
	scannerVal  *redaction.Scanner
	scannerErr  error
)

func testScanner(tb testing.TB) *redaction.Scanner {
	tb.Helper()
	scannerOnce.Do(func() { scannerVal, scannerErr = redaction.NewScanner(redaction.Config{}) })
	if scannerErr != nil {
		tb.Fatalf("NewScanner: %v", scannerErr)
	}
	return scannerVal
}

func testClassifier(tb testing.TB) *Classifier {
	tb.Helper()
	return NewClassifier(testScanner(tb), nil)
}

// classify runs the default classifier and fails the test on an error.
func classify(tb testing.TB, ep Endpoint, body, declared string) *Annotation {
	tb.Helper()
	a, err := testClassifier(tb).Classify(ep, []byte(body), declared, "")
	if err != nil {
		tb.Fatalf("Classify(%s, %s): %v", ep, body, err)
	}
	return a
}

// defaultEngine is the embedded default policy (policies/*.rego).
func defaultEngine(tb testing.TB) *policies.Engine {
	tb.Helper()
	e, err := policies.New(context.Background(), policies.Options{})
	if err != nil {
		tb.Fatalf("policies.New: %v", err)
	}
	return e
}

// echoPolicy returns the decision found at input.decision, so a test can
// ask the real engine (and its contract checks) for any decision it needs.
const echoPolicy = `package molly.policy

import rego.v1

default decision := {"allow": false, "tiers": [], "reasons": ["no decision in input"]}

decision := input.decision if input.decision
`

// decisionOf evaluates echoPolicy from a policy directory with want as the
// decision; the result is a real *policies.Decision.
func decisionOf(tb testing.TB, want map[string]any) *policies.Decision {
	tb.Helper()
	dir := tb.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "echo.rego"), []byte(echoPolicy), 0o600); err != nil {
		tb.Fatal(err)
	}
	e, err := policies.New(context.Background(), policies.Options{Dir: dir})
	if err != nil {
		tb.Fatalf("policies.New: %v", err)
	}
	d := e.DecideMap(context.Background(), map[string]any{"decision": want})
	if _, ok := want["allow"]; ok && want["allow"] == true && !d.Allowed() {
		tb.Fatalf("policy denied %v: %v", want, d.Reasons())
	}
	return d
}

// allowTiers is a decision allowing tiers, redacting redact[tier].
func allowTiers(tb testing.TB, tiers []string, redact map[string][]string) *policies.Decision {
	tb.Helper()
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
	return decisionOf(tb, map[string]any{"allow": true, "tiers": ts, "redact": rd, "reasons": []any{"test"}})
}

// decideDefault asks the embedded default policy about a.
func decideDefault(tb testing.TB, e *policies.Engine, a *Annotation, c *Catalogue) *policies.Decision {
	tb.Helper()
	return e.DecideMap(context.Background(), PolicyInput(a, "tester", c))
}

func newCatalogue(tb testing.TB, targets ...*Target) *Catalogue {
	tb.Helper()
	c, err := NewCatalogue(targets, nil)
	if err != nil {
		tb.Fatalf("NewCatalogue: %v", err)
	}
	tb.Cleanup(c.Close)
	return c
}
