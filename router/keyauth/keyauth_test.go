package keyauth

import "testing"

func TestBearer(t *testing.T) {
	tests := []struct {
		name, header, want string
		ok                 bool
	}{
		{"a bearer token is read", "Bearer sk-molly-abc", "sk-molly-abc", true},
		{"the scheme is case-insensitive", "bearer sk-molly-abc", "sk-molly-abc", true},
		{"another scheme is no key", "Basic dXNlcjpwYXNz", "", false},
		{"an empty token is no key", "Bearer ", "", false},
		{"no header is no key", "", "", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ok := Bearer(tt.header)
			if got != tt.want || ok != tt.ok {
				t.Fatalf("Bearer(%q) = %q, %v; want %q, %v", tt.header, got, ok, tt.want, tt.ok)
			}
		})
	}
}
