package app

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
)

func TestCaddyfileUsageTool(t *testing.T) {
	tool := `tool billing {
			path /opt/molly/billing
			sha256 0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef
		}`
	v, err := parseGlobal(caddyfile.NewTestDispenser("molly {\n"+tool+"\nusage_tool billing\n}"), nil)
	if err != nil {
		t.Fatal(err)
	}
	var a App
	if err := json.Unmarshal(v.(httpcaddyfile.App).Value, &a); err != nil {
		t.Fatal(err)
	}
	if a.UsageTool != "billing" {
		t.Fatalf("usage_tool %q", a.UsageTool)
	}
	for _, c := range []struct{ in, want string }{
		{"molly {\n usage_tool billing\n}", `usage_tool "billing" is not a configured tool`},
		{"molly {\n" + tool + "\n usage_tool payments\n}", `usage_tool "payments" is not a configured tool`},
		{"molly {\n usage_tool\n}", "wrong argument count"},
	} {
		_, err := parseGlobal(caddyfile.NewTestDispenser(c.in), nil)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: error %v, want %q", c.in, err, c.want)
		}
	}
}

func TestCaddyfileRegistry(t *testing.T) {
	v, err := parseGlobal(caddyfile.NewTestDispenser("molly {\n registry /var/lib/molly/molly.db\n}"), nil)
	if err != nil {
		t.Fatal(err)
	}
	var a App
	if err := json.Unmarshal(v.(httpcaddyfile.App).Value, &a); err != nil {
		t.Fatal(err)
	}
	if a.RegistryFile != "/var/lib/molly/molly.db" {
		t.Fatalf("registry %q", a.RegistryFile)
	}
	if _, err := parseGlobal(caddyfile.NewTestDispenser("molly {\n registry\n}"), nil); err == nil || !strings.Contains(err.Error(), "wrong argument count") {
		t.Fatalf("registry without a path: %v", err)
	}
}
