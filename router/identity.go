package router

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"

	"github.com/tidwall/gjson"

	"github.com/molly-gateway/molly/api"
)

// Identity is the caller as the auth step (molly_auth) established it from
// the request's API key. It travels in the request context (WithIdentity),
// read-only after it is made. Without molly_auth there is none, and the
// policy sees member "anonymous" without scopes.
type Identity struct {
	// Member is the caller's name in the registry.
	Member string
	// Models, Tiers and Tools are the member's scopes: the client model
	// names it may ask for (a trailing "*" matches a prefix), the tiers its
	// requests may reach ("T0".."T3"; the policy intersects the decision with
	// them), and the function names its requests may declare. Empty: any.
	Models, Tiers, Tools []string
	// Budgeted reports a spending budget; RemainingUSD is then what is left
	// of it in the current period, in USD (the auth step refuses at ≤ 0).
	Budgeted     bool
	RemainingUSD float64
	// Ledger records what the member's requests consume; nil records nothing.
	Ledger Ledger
}

// Ledger is where usage is recorded (the registry's SQLite ledger, through
// the Caddy glue, which keeps this package free of storage code).
type Ledger interface {
	// Record stores u durably and returns once it is committed: the
	// forwarder acknowledges the request (the body, or the stream's [DONE])
	// only afterwards.
	Record(ctx context.Context, u Usage) error
}

// Reserver is optionally implemented by a Ledger that admits requests
// against the member's budget and token rate limit while they run: the
// forwarder calls Reserve once the candidates are known, with the
// request's expected tokens (prompt estimate + max_tokens, or
// DefaultCompletionTokens) and expected cost (the costliest candidate's),
// and calls release once the request is over (its usage recorded, or it
// failed). A refusal is an *api.Error (429 insufficient_quota or
// rate_limit_exceeded) that the forwarder returns unwritten. One
// candidate's cost is held: a cascade's escalations or a mixture's further
// members can still spend past it (they are recorded, and the next
// request sees the spend).
type Reserver interface {
	Reserve(ctx context.Context, tokens int, expectedUSD float64) (release func(), err error)
}

// reserve holds the request's expected tokens and cost on the identity's
// ledger when it is a Reserver; release is never nil.
func reserve(ctx context.Context, a *Annotation, cands []Candidate) (release func(), err error) {
	id := IdentityFrom(ctx)
	if id == nil {
		return func() {}, nil
	}
	rv, ok := id.Ledger.(Reserver)
	if !ok {
		return func() {}, nil
	}
	out := a.MaxTokens
	if out == 0 && a.Endpoint != EndpointEmbeddings {
		out = DefaultCompletionTokens
	}
	expected := 0.0
	for _, c := range cands {
		expected = max(expected, c.CostUSD)
	}
	release, err = rv.Reserve(ctx, a.PromptTokens+out, expected)
	if err != nil {
		return func() {}, err
	}
	return release, nil
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

// Check refuses, with a 403 OpenAI error, a request for a model or a tool
// outside the identity's scopes. A nil identity allows everything. The
// listing of models (EndpointModels) is not refused but filtered by the
// forwarder to the models in scope.
func (id *Identity) Check(a *Annotation) *api.Error {
	if id == nil {
		return nil
	}
	if a.Model != "" && !id.allowsModel(a.Model) {
		return &api.Error{Status: http.StatusForbidden, Type: "invalid_request_error", Param: "model", Code: "model_not_allowed",
			Message: fmt.Sprintf("Your API key may not use the model `%s`; its scope allows %s.", a.Model, strings.Join(id.Models, ", "))}
	}
	if len(id.Tools) > 0 {
		for _, name := range toolNames(a.Body) {
			if !slices.ContainsFunc(id.Tools, func(p string) bool { return scopeMatch(p, name) }) {
				return &api.Error{Status: http.StatusForbidden, Type: "invalid_request_error", Param: "tools", Code: "tool_not_allowed",
					Message: fmt.Sprintf("Your API key may not use the tool `%s`; its scope allows %s.", name, strings.Join(id.Tools, ", "))}
			}
		}
	}
	return nil
}

// allowsModel reports whether the model scope admits the client model
// name; a nil identity or an empty scope admits every model.
func (id *Identity) allowsModel(model string) bool {
	return id == nil || len(id.Models) == 0 || slices.ContainsFunc(id.Models, func(p string) bool { return scopeMatch(p, model) })
}

// scopeMatch matches a name against a scope entry: equal, or a prefix
// ending in "*".
func scopeMatch(pattern, name string) bool {
	if p, ok := strings.CutSuffix(pattern, "*"); ok {
		return strings.HasPrefix(name, p)
	}
	return pattern == name
}

// toolNames returns the function names a chat request declares: tools[].function.name
// and the legacy functions[].name.
func toolNames(body []byte) []string {
	var out []string
	for _, path := range []string{"tools.#.function.name", "functions.#.name"} {
		for _, v := range gjson.GetBytes(body, path).Array() {
			out = append(out, v.String())
		}
	}
	return out
}

type identityKey struct{}

// WithIdentity returns ctx carrying id.
func WithIdentity(ctx context.Context, id *Identity) context.Context {
	return context.WithValue(ctx, identityKey{}, id)
}

// IdentityFrom returns the identity set by the auth step, or nil.
func IdentityFrom(ctx context.Context) *Identity {
	id, _ := ctx.Value(identityKey{}).(*Identity)
	return id
}

// identityInput is the identity as the policy input document shows it
// (schema in policies/README.md).
func identityInput(id *Identity) map[string]any {
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
