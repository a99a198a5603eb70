package registry

import (
	"errors"
	"reflect"
	"testing"
)

func TestParseScopes(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   []string
		want Scopes
		bad  string
	}{
		{"no scopes allow everything", nil, Scopes{}, ""},
		{"each kind goes to its list, in order", []string{"tool:echo", "model:gpt-4o-mini", "tier:T1", "model:molly-demo:*", "tier:T0"},
			Scopes{Models: []string{"gpt-4o-mini", "molly-demo:*"}, Tiers: []string{"T1", "T0"}, Tools: []string{"echo"}}, ""},
		{"a scope without a kind is refused", []string{"admin"}, Scopes{}, "admin"},
		{"an unknown kind is refused", []string{"admin:keys"}, Scopes{}, "admin:keys"},
		{"an empty value is refused", []string{"tool:"}, Scopes{}, "tool:"},
		{"a tier outside T0..T3 is refused", []string{"tier:T9"}, Scopes{}, "tier:T9"},
		{"a value with a space is refused", []string{"model:a b"}, Scopes{}, "model:a b"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseScopes(tc.in)
			if tc.bad != "" {
				var se *ScopeError
				if !errors.As(err, &se) || se.Scope != tc.bad || !errors.Is(err, ErrInvalid) ||
					err.Error() != `scope "`+tc.bad+`": want model:<name>, tier:<tier> or tool:<name>` {
					t.Fatalf("err %v, want a ScopeError for %q", err, tc.bad)
				}
				return
			}
			if err != nil || !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("ParseScopes = %+v, %v; want %+v", got, err, tc.want)
			}
		})
	}
	s := Scopes{Models: []string{"m"}, Tiers: []string{"T2"}, Tools: []string{"x", "y"}}
	if got := s.Strings(); !reflect.DeepEqual(got, []string{"model:m", "tier:T2", "tool:x", "tool:y"}) {
		t.Fatalf("Strings = %v", got)
	}
}
