package classify

import (
	"context"
	"reflect"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
)

func parse(t *testing.T, input string) (*Classify, error) {
	t.Helper()
	c := new(Classify)
	return c, c.UnmarshalCaddyfile(caddyfile.NewTestDispenser(input))
}

func TestCaddyfileRedactionSettings(t *testing.T) {
	c, err := parse(t, "molly_classify {\n"+
		"	redact_mode EMAIL hash\n"+
		"	redact_mode CREDIT_CARD mask\n"+
		"	hash_key_env MOLLY_HASH_KEY\n"+
		"	pattern EMPLOYEE_ID E-\\d{6}\n"+
		"	pattern EMPLOYEE_ID `badge #(?P<value>\\d+)`\n"+
		"	dictionary PROJECT Falcon \"Blue Heron\"\n"+
		"	dictionary PROJECT Osprey\n"+
		"	sensitivity PROJECT internal\n"+
		"}")
	if err != nil {
		t.Fatal(err)
	}
	want := &Classify{
		RedactModes:  map[string]string{"EMAIL": "hash", "CREDIT_CARD": "mask"},
		HashKeyEnv:   "MOLLY_HASH_KEY",
		Patterns:     map[string][]string{"EMPLOYEE_ID": {`E-\d{6}`, `badge #(?P<value>\d+)`}},
		Dictionaries: map[string][]string{"PROJECT": {"Falcon", "Blue Heron", "Osprey"}},
		Sensitivity:  map[string]string{"PROJECT": "internal"},
	}
	if !reflect.DeepEqual(c, want) {
		t.Fatalf("parsed %+v\nwant   %+v", c, want)
	}
}

func TestCaddyfileRejectsBadRedactionSettings(t *testing.T) {
	cases := []struct{ name, block, want string }{
		{"an unknown mode is named", "redact_mode EMAIL scramble", `unknown mode "scramble"`},
		{"a mode without a type is an error", "redact_mode hash", "redact_mode takes"},
		{"a pattern without a regex is an error", "pattern EMPLOYEE_ID", "pattern takes"},
		{"a dictionary without words is an error", "dictionary PROJECT", "dictionary takes"},
		{"hash_key_env without a name is an error", "hash_key_env", "hash_key_env takes"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := parse(t, "molly_classify {\n"+tc.block+"\n}")
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error = %v, want one containing %q", err, tc.want)
			}
		})
	}
}

func TestProvisionValidatesRedactionSettings(t *testing.T) {
	t.Setenv("MOLLY_TEST_SHORT_KEY", "short")
	t.Setenv("MOLLY_TEST_GOOD_KEY", strings.Repeat("k", 32))
	cases := []struct {
		name string
		c    Classify
		want string // "" means success
	}{
		{"custom types, modes and a long key are accepted", Classify{
			Patterns: map[string][]string{"EMPLOYEE_ID": {`E-\d{6}`}}, Dictionaries: map[string][]string{"PROJECT": {"Falcon"}},
			RedactModes: map[string]string{"EMPLOYEE_ID": "mask", "EMAIL": "hash"}, HashKeyEnv: "MOLLY_TEST_GOOD_KEY"}, ""},
		{"a lower-case custom type is refused", Classify{Patterns: map[string][]string{"project": {"x+"}}}, `custom type "project" must start with an upper-case letter`},
		{"a custom type named like a built-in is refused", Classify{Dictionaries: map[string][]string{"EMAIL": {"x"}}}, `custom type "EMAIL" is a built-in type`},
		{"a regex that does not compile is refused", Classify{Patterns: map[string][]string{"CODE": {`a(b`}}}, "pattern for CODE: error parsing regexp"},
		{"a regex matching the empty string is refused", Classify{Patterns: map[string][]string{"CODE": {`\d*`}}}, "matches the empty string"},
		{"a mode for a type no detector finds is refused", Classify{RedactModes: map[string]string{"PASSPORT": "mask"}}, "redact_mode PASSPORT: no enabled detector"},
		{"an unset key variable is refused", Classify{HashKeyEnv: "MOLLY_TEST_UNSET_KEY"}, "MOLLY_TEST_UNSET_KEY is unset or shorter than 32 bytes"},
		{"a short key is refused without showing it", Classify{HashKeyEnv: "MOLLY_TEST_SHORT_KEY"}, "MOLLY_TEST_SHORT_KEY is unset or shorter than 32 bytes"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
			defer cancel()
			err := tc.c.Provision(ctx)
			if tc.want == "" {
				if err != nil || tc.c.classifier == nil {
					t.Fatalf("Provision = %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Provision error = %v, want one containing %q", err, tc.want)
			}
			if strings.Contains(err.Error(), "short\"") || strings.Contains(err.Error(), ": short") {
				t.Fatalf("the error shows the key: %v", err)
			}
		})
	}
}
