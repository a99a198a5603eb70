package auth

import (
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
)

func TestUnmarshalCaddyfile(t *testing.T) {
	tests := []struct {
		name    string
		input   string
		want    Auth
		wantErr string
	}{
		{"no block keeps the defaults", `molly_auth`, Auth{}, ""},
		{"db and anonymous are read", "molly_auth {\n db /var/lib/molly.db\n anonymous local\n}", Auth{DB: "/var/lib/molly.db", Anonymous: "local"}, ""},
		{"an argument on the directive is refused", `molly_auth /x.db`, Auth{}, "settings go in a block"},
		{"db without a path is refused", "molly_auth {\n db\n}", Auth{}, "db takes one path"},
		{"an unknown setting is refused", "molly_auth {\n keys 3\n}", Auth{}, `unrecognized subdirective "keys"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var got Auth
			err := got.UnmarshalCaddyfile(caddyfile.NewTestDispenser(tt.input))
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil || got.DB != tt.want.DB || got.Anonymous != tt.want.Anonymous {
				t.Fatalf("got %+v, %v; want %+v", got, err, tt.want)
			}
		})
	}
}

func TestValidateRefusesABadAnonymousName(t *testing.T) {
	if err := (&Auth{Anonymous: "two words"}).Validate(); err == nil || !strings.Contains(err.Error(), "anonymous") {
		t.Fatalf("Validate = %v", err)
	}
	if err := (&Auth{Anonymous: "local"}).Validate(); err != nil {
		t.Fatalf("Validate(local) = %v", err)
	}
}
