package policies

import (
	"context"
	"os"
	"path/filepath"
	"testing"
)

func orchestrationInput(worstUSD float64) map[string]any {
	return map[string]any{
		"plan": map[string]any{"id": "p1", "planner": "deterministic", "max_refinements": 0,
			"budget": map[string]any{"max_tokens": 1000, "max_cost_usd": 0.01},
			"subtasks": []any{map[string]any{"id": "s1", "specialist": map[string]any{"kind": "model", "name": "chat"},
				"tier_ceiling": "T3", "budget": map[string]any{"max_tokens": 100, "max_cost_usd": 0.01}, "depends_on": []any{}, "alternatives": 1}}},
		"metrics":   map[string]any{"subtasks": 1, "depth": 1, "fan_out": 1, "worst_case": map[string]any{"tokens": 500, "cost_usd": worstUSD}},
		"catalogue": map[string]any{"models": []any{"chat"}, "tools": []any{}},
		"identity":  map[string]any{"member": "alice", "scopes": []any{}},
	}
}

func TestDecideOrchestration(t *testing.T) {
	e := defaultEngine(t)
	if d := e.DecideOrchestration(context.Background(), orchestrationInput(0.005)); !d.Allow || d.Code != "" || len(d.ID) != 36 {
		t.Errorf("a plan within budget: %+v, want allowed", d)
	}
	d := e.DecideOrchestration(context.Background(), orchestrationInput(0.02))
	if d.Allow || d.Code != CodePolicyDenied || len(d.Reasons) != 1 || d.Reasons[0] != "the plan's worst case of 0.02 USD is over its budget of 0.01 USD" {
		t.Errorf("a plan over budget: %+v, want denied with the budget reason", d)
	}
}

func TestAPolicyDirectoryWithoutOrchestrationDeniesEveryPlan(t *testing.T) {
	dir := t.TempDir()
	src := "package molly.policy\nimport rego.v1\ndecision := {\"allow\": true, \"tiers\": [\"T0\"]}\n"
	if err := os.WriteFile(filepath.Join(dir, "p.rego"), []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	e, err := New(context.Background(), Options{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	if d := e.DecideOrchestration(context.Background(), orchestrationInput(0.005)); d.Allow || d.Code != CodePolicyError {
		t.Errorf("without orchestration.rego: %+v, want a fail-closed denial", d)
	}
}
