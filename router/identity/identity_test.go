package identity

import (
	"bytes"
	"context"
	"encoding/json"
	"math"
	"reflect"
	"testing"

	"github.com/open-policy-agent/opa/v1/ast"

	"github.com/molly-gateway/molly/router/meter"
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

// ledgerFunc is a meter.Ledger for checking which ledger an identity has.
type ledgerFunc func(context.Context, meter.Usage) error

func (f ledgerFunc) Record(ctx context.Context, u meter.Usage) error { return f(ctx, u) }

func TestPolicyValueIsThePolicyInputDocument(t *testing.T) {
	for _, tc := range []struct {
		name string
		id   *Identity
	}{
		{"no identity is anonymous", nil},
		{"a member without scopes", &Identity{Member: "alice"}},
		{"a scoped, budgeted member", &Identity{Member: "bob", Models: []string{"gpt-*"}, Tiers: []string{"T0", "T1"}, Tools: []string{"refund"},
			Budgeted: true, RemainingUSD: 1.25}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// OPA's own converter, from the JSON of the input document.
			raw, err := json.Marshal(tc.id.PolicyInput())
			if err != nil {
				t.Fatal(err)
			}
			want, err := ast.ValueFromReader(bytes.NewReader(raw))
			if err != nil {
				t.Fatal(err)
			}
			for range 2 { // built once, then the same value
				got, err := tc.id.PolicyValue()
				if err != nil {
					t.Fatal(err)
				}
				if ast.Compare(got, want) != 0 {
					t.Fatalf("PolicyValue = %v, want %v", got, want)
				}
			}
		})
	}
	if _, err := (&Identity{Member: "x", Budgeted: true, RemainingUSD: math.NaN()}).PolicyValue(); err == nil {
		t.Fatal("a NaN budget converted without error")
	}
}

func TestWithLedgerCopiesEveryOtherField(t *testing.T) {
	var old, next int
	src := &Identity{Ledger: ledgerFunc(func(context.Context, meter.Usage) error { old++; return nil })}
	// Every exported field gets a value that is not its zero, so a field
	// added to Identity and forgotten in WithLedger fails here.
	v := reflect.ValueOf(src).Elem()
	for i := range v.NumField() {
		f := v.Field(i)
		if !v.Type().Field(i).IsExported() || v.Type().Field(i).Name == "Ledger" {
			continue
		}
		switch f.Kind() {
		case reflect.String:
			f.SetString("s" + v.Type().Field(i).Name)
		case reflect.Slice:
			f.Set(reflect.ValueOf([]string{v.Type().Field(i).Name}))
		case reflect.Bool:
			f.SetBool(true)
		case reflect.Float64:
			f.SetFloat(2.5)
		case reflect.Int:
			f.SetInt(7)
		default:
			t.Fatalf("field %s of kind %s: extend this test", v.Type().Field(i).Name, f.Kind())
		}
	}
	want, _ := src.PolicyValue()
	cp := src.WithLedger(ledgerFunc(func(context.Context, meter.Usage) error { next++; return nil }))
	cv := reflect.ValueOf(cp).Elem()
	for i := range v.NumField() {
		name := v.Type().Field(i).Name
		if !v.Type().Field(i).IsExported() || name == "Ledger" {
			continue
		}
		if !reflect.DeepEqual(v.Field(i).Interface(), cv.Field(i).Interface()) {
			t.Fatalf("WithLedger lost %s: %v, want %v", name, cv.Field(i).Interface(), v.Field(i).Interface())
		}
	}
	_ = cp.Ledger.Record(context.Background(), meter.Usage{})
	if old != 0 || next != 1 {
		t.Fatalf("records: old ledger %d, new ledger %d; want 0 and 1", old, next)
	}
	got, _ := cp.PolicyValue()
	if ast.Compare(got, want) != 0 {
		t.Fatalf("the copy's PolicyValue = %v, want %v", got, want)
	}
	if a := (*Identity)(nil).WithLedger(nil); a.Member != "anonymous" {
		t.Fatalf("nil.WithLedger().Member = %q", a.Member)
	}
}
