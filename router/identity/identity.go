// Package identity is the caller of a request as the auth step (molly_auth)
// established it from its API key: member, scopes, remaining budget and the
// ledger its usage is recorded in. What the scopes allow is decided in
// Rego (policies/residency.rego); this package only carries them.
package identity

import (
	"context"
	"sync"

	"github.com/open-policy-agent/opa/v1/ast"

	"github.com/molly-gateway/molly/policies"
	"github.com/molly-gateway/molly/router/meter"
)

// Identity travels in the request context (With), read-only after it is
// made. Without molly_auth there is none, and the policy sees member
// "anonymous" without scopes.
type Identity struct {
	// Member is the caller's name in the registry.
	Member string
	// KeyPrefix is the prefix of the API key the caller presented (the
	// registry's display form, never the key); "" without one.
	KeyPrefix string
	// Models, Tiers and Tools are the member's scopes: the client model
	// names it may ask for (a trailing "*" matches a prefix), the tiers its
	// requests may reach ("T0".."T3"), and the function names its requests
	// may declare or governed tools it may use. Empty: any.
	Models, Tiers, Tools []string
	// Budgeted reports a spending budget; RemainingUSD is then what is left
	// of it in the current period, in USD (the auth step refuses at ≤ 0).
	Budgeted     bool
	RemainingUSD float64
	// TPM is the member's tokens-per-minute limit, 0 for none.
	TPM int
	// Ledger records what the member's requests consume; nil records
	// nothing. When it is also a meter.Reserver, requests reserve their
	// worst case on it.
	Ledger meter.Ledger

	policyOnce  sync.Once
	policyValue ast.Value
	policyErr   error
}

// Name is the member name, "anonymous" for a nil identity.
func (id *Identity) Name() string {
	if id == nil {
		return "anonymous"
	}
	return id.Member
}

// Scopes lists the identity's scopes as strings, "model:<name>",
// "tier:<T>" and "tool:<name>", for the policy input.
func (id *Identity) Scopes() []string {
	out := []string{}
	if id == nil {
		return out
	}
	for _, s := range []struct {
		kind string
		list []string
	}{{"model", id.Models}, {"tier", id.Tiers}, {"tool", id.Tools}} {
		for _, v := range s.list {
			out = append(out, s.kind+":"+v)
		}
	}
	return out
}

// PolicyInput is the identity as the policy input document shows it
// (input.identity, schema in policies/README.md); never the key.
func (id *Identity) PolicyInput() map[string]any {
	list := func(s []string) []any {
		out := make([]any, len(s))
		for i, v := range s {
			out[i] = v
		}
		return out
	}
	if id == nil {
		id = &Identity{Member: "anonymous"}
	}
	m := map[string]any{
		"member": id.Member,
		"scopes": list(id.Scopes()),
		"models": list(id.Models),
		"tiers":  list(id.Tiers),
		"tools":  list(id.Tools),
	}
	if id.Budgeted {
		m["remaining_usd"] = id.RemainingUSD
	}
	return m
}

// WithLedger returns a copy of id whose usage goes to l (id itself is
// read-only); nil is copied as the anonymous identity.
func (id *Identity) WithLedger(l meter.Ledger) *Identity {
	if id == nil {
		return &Identity{Member: "anonymous", Ledger: l}
	}
	return &Identity{Member: id.Member, KeyPrefix: id.KeyPrefix, Models: id.Models, Tiers: id.Tiers, Tools: id.Tools,
		Budgeted: id.Budgeted, RemainingUSD: id.RemainingUSD, TPM: id.TPM, Ledger: l}
}

// anonymousValue is PolicyValue of a nil identity.
var anonymousValue = sync.OnceValues(func() (ast.Value, error) { return policies.ValueOf((*Identity)(nil).PolicyInput()) })

// PolicyValue is PolicyInput converted to an OPA value (policies.ValueOf)
// once per identity, which is read-only after it is made: a member's
// requests share it instead of building the document per request. An
// error is ValueOf's (a remaining budget that is not a finite number).
func (id *Identity) PolicyValue() (ast.Value, error) {
	if id == nil {
		return anonymousValue()
	}
	id.policyOnce.Do(func() { id.policyValue, id.policyErr = policies.ValueOf(id.PolicyInput()) })
	return id.policyValue, id.policyErr
}

type key struct{}

// With returns ctx carrying id.
func With(ctx context.Context, id *Identity) context.Context {
	return context.WithValue(ctx, key{}, id)
}

// From returns the identity set by the auth step, or nil.
func From(ctx context.Context) *Identity {
	id, _ := ctx.Value(key{}).(*Identity)
	return id
}
