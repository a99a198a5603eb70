package route

import (
	"testing"

	"github.com/open-policy-agent/opa/v1/ast"

	"github.com/molly-gateway/molly/policies"
)

// samePolicyTargets fails t unless c.PolicyTargets() holds, target by
// target, the value policies.ValueOf makes of PolicyView (the conversion
// Decide did per request before).
func samePolicyTargets(t *testing.T, c *Catalogue) []any {
	t.Helper()
	got := c.PolicyTargets()
	if len(got) != len(c.Targets()) {
		t.Fatalf("PolicyTargets has %d entries for %d targets", len(got), len(c.Targets()))
	}
	for i, tg := range c.Targets() {
		want, err := policies.ValueOf(tg.PolicyView())
		if err != nil {
			t.Fatal(err)
		}
		v, ok := got[i].(ast.Value)
		if !ok || ast.Compare(v, want) != 0 {
			t.Fatalf("PolicyTargets[%d] = %v, want %v", i, got[i], want)
		}
	}
	return got
}

func TestPolicyTargetsAreConvertedOnce(t *testing.T) {
	e := demoEngine(t)
	c, err := NewCatalogue([]*Target{
		{Name: "lan", Tier: "T1", Endpoint: "http://127.0.0.1:1/v1", Models: []string{"m=up", "n"}, PriceIn: 0.5, PriceOut: 1.25},
		{Name: "device", Tier: "T0", Kind: KindEngine, Models: []string{"m"}},
	}, e)
	if err != nil {
		t.Fatal(err)
	}
	first := samePolicyTargets(t, c)
	if again := samePolicyTargets(t, c); &again[0] != &first[0] {
		t.Fatal("PolicyTargets converted the targets again although nothing changed")
	}
	adapters := e.Adapters()
	if len(adapters) == 0 {
		t.Fatal("the demo engine has no adapters to remove")
	}
	if err := e.RemoveAdapter(adapters[0].Name); err != nil {
		t.Fatal(err)
	}
	if after := samePolicyTargets(t, c); &after[0] == &first[0] {
		t.Fatal("PolicyTargets kept the old engine models after an adapter was removed")
	}
}
