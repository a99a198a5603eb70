package keyauth

import (
	"net/http"
	"testing"
)

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

func TestKeyReadsTheBearerTokenElseXAPIKey(t *testing.T) {
	for _, tc := range []struct {
		name   string
		header http.Header
		want   string
		ok     bool
	}{
		{"a bearer token is the key", http.Header{"Authorization": {"Bearer sk-molly-a"}, "X-Api-Key": {"sk-molly-b"}}, "sk-molly-a", true},
		{"x-api-key is the key without Authorization", http.Header{"X-Api-Key": {" sk-molly-b "}}, "sk-molly-b", true},
		{"another scheme is no key, x-api-key or not", http.Header{"Authorization": {"Basic dXNlcjpwYXNz"}, "X-Api-Key": {"sk-molly-b"}}, "", false},
		{"nothing is no key", http.Header{}, "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got, ok := Key(tc.header); got != tc.want || ok != tc.ok {
				t.Fatalf("Key = %q, %v; want %q, %v", got, ok, tc.want, tc.ok)
			}
		})
	}
}
