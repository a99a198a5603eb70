package identity

import (
	"context"
	"reflect"
	"testing"
)

func TestWithIdentity(t *testing.T) {
	if From(context.Background()) != nil {
		t.Fatal("identity from an empty context")
	}
	id := &Identity{Member: "a"}
	if From(With(context.Background(), id)) != id {
		t.Fatal("identity lost")
	}
}

func TestPolicyInputCarriesTheScopesNeverTheKey(t *testing.T) {
	id := &Identity{Member: "alice", Models: []string{"m"}, Tiers: []string{"T0", "T1"}, Tools: []string{"lookup"}, Budgeted: true, RemainingUSD: 0.25}
	want := map[string]any{"member": "alice", "scopes": []any{"model:m", "tier:T0", "tier:T1", "tool:lookup"},
		"models": []any{"m"}, "tiers": []any{"T0", "T1"}, "tools": []any{"lookup"}, "remaining_usd": 0.25}
	if got := id.PolicyInput(); !reflect.DeepEqual(got, want) {
		t.Fatalf("PolicyInput = %v, want %v", got, want)
	}
	var anon *Identity
	want = map[string]any{"member": "anonymous", "scopes": []any{}, "models": []any{}, "tiers": []any{}, "tools": []any{}}
	if got := anon.PolicyInput(); !reflect.DeepEqual(got, want) {
		t.Fatalf("nil identity PolicyInput = %v, want %v", got, want)
	}
	if anon.Name() != "anonymous" || !reflect.DeepEqual(anon.Scopes(), []string{}) {
		t.Fatalf("nil identity: %q %v", anon.Name(), anon.Scopes())
	}
}
