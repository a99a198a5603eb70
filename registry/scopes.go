package registry

import (
	"slices"
	"strings"
)

// Scopes are a member's scopes (Member.Models, Tiers, Tools) as lists.
type Scopes struct {
	Models, Tiers, Tools []string
}

// ScopeError reports a scope string ParseScopes cannot read; it matches
// ErrInvalid with errors.Is.
type ScopeError struct{ Scope string }

func (e *ScopeError) Error() string {
	return `scope "` + e.Scope + `": want model:<name>, tier:<tier> or tool:<name>`
}

// Is makes a ScopeError match ErrInvalid.
func (e *ScopeError) Is(target error) bool { return target == ErrInvalid }

// ParseScopes reads scope strings as molly_auth writes them for the policy
// input (router.Identity.Scopes): "model:<name>" (a trailing "*" matches a
// prefix), "tier:<T0..T3>" and "tool:<name>", in any order. Errors:
// *ScopeError for another kind, an empty value, a value with spaces or a
// tier outside T0..T3.
func ParseScopes(list []string) (Scopes, error) {
	var s Scopes
	for _, sc := range list {
		kind, v, ok := strings.Cut(sc, ":")
		if !ok || v == "" || strings.ContainsAny(v, " \t\r\n") {
			return Scopes{}, &ScopeError{sc}
		}
		switch kind {
		case "model":
			s.Models = append(s.Models, v)
		case "tier":
			if !slices.Contains([]string{"T0", "T1", "T2", "T3"}, v) {
				return Scopes{}, &ScopeError{sc}
			}
			s.Tiers = append(s.Tiers, v)
		case "tool":
			s.Tools = append(s.Tools, v)
		default:
			return Scopes{}, &ScopeError{sc}
		}
	}
	return s, nil
}

// Strings writes s as scope strings, models then tiers then tools: the
// inverse of ParseScopes.
func (s Scopes) Strings() []string {
	out := []string{}
	for _, k := range []struct {
		kind string
		list []string
	}{{"model", s.Models}, {"tier", s.Tiers}, {"tool", s.Tools}} {
		for _, v := range k.list {
			out = append(out, k.kind+":"+v)
		}
	}
	return out
}
