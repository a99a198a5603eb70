package orchestrate

import (
	"net/http"
	"testing"

	"github.com/molly-gateway/molly/router/route"
	"github.com/molly-gateway/molly/serving"
)

// TestTheDeterministicPlannerServesTheDemoModel runs the feature as a
// fresh install does: no controller, the T0 engine on the generated demo
// model with its adapters, a request to molly-orchestrator whose two
// parts belong to two adapters' domains.
func TestTheDeterministicPlannerServesTheDemoModel(t *testing.T) {
	if testing.Short() {
		t.Skip("testing.Short: the demo engine loads a generated model")
	}
	dir := t.TempDir()
	if err := serving.WriteDemo(dir, 1, "tiny"); err != nil {
		t.Fatal(err)
	}
	cfg := serving.DemoConfig(dir)
	cfg.NSeqMax, cfg.NCtx, cfg.Threads = 2, 2048, 1
	e, err := serving.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	none := 0
	g := startGateway(t, setup{engine: e, cfg: Config{MaxRefinements: &none},
		targets: []*route.Target{{Name: "local", Tier: "T0", Kind: route.KindEngine}}})
	prompt := "1. Why was I charged twice on my last invoice?\n2. Is the termination clause of my contract enforceable?"
	r := post(t, t.Context(), g.url, chat(ModelName, prompt, "max_tokens", "8"))
	if r.status != http.StatusOK {
		t.Fatalf("status %d: %s", r.status, r.body)
	}
	rec := g.record(t, r)
	if rec.Get("planner").String() != PlannerDeterministic || rec.Get("subtasks.#").Int() != 2 {
		t.Fatalf("record %s", rec.Raw)
	}
	for i, want := range []string{"molly-demo:billing", "molly-demo:legal"} {
		s := rec.Get("subtasks." + string(rune('0'+i)))
		if s.Get("specialist").String() != want || s.Get("model").String() != want || s.Get("tier").String() != "T0" || s.Get("outcome").String() != OutcomeOK {
			t.Errorf("subtask %d: %s, want %s answering on T0", i, s.Raw, want)
		}
	}
}
