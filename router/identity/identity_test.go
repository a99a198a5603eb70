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

func TestFromScopes(t *testing.T) {
	id, err := FromScopes("bob", []string{"model:gpt-*", "tier:T2", "tool:payments", "model:m"})
	if err != nil {
		t.Fatal(err)
	}
	want := &Identity{Member: "bob", Models: []string{"gpt-*", "m"}, Tiers: []string{"T2"}, Tools: []string{"payments"}}
	if !reflect.DeepEqual(id, want) {
		t.Fatalf("FromScopes = %+v, want %+v", id, want)
	}
	if got := id.Scopes(); !reflect.DeepEqual(got, []string{"model:gpt-*", "model:m", "tier:T2", "tool:payments"}) {
		t.Fatalf("Scopes = %v", got)
	}
	for _, bad := range []string{"model:", "admin", "region:EU", ":x"} {
		if _, err := FromScopes("bob", []string{"tier:T0", bad}); err == nil || err.Error() != `scope "`+bad+`": want model:<name>, tier:<tier> or tool:<name>` {
			t.Errorf("FromScopes(%q) = %v", bad, err)
		}
	}
}
