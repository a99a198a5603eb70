package app

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"

	"github.com/molly-gateway/molly/plugins"
)

func TestCaddyfileTools(t *testing.T) {
	d := caddyfile.NewTestDispenser(`molly {
		tool payments {
			path /opt/molly/payments
			sha256 0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef
			env MOLLY_PAYMENTS_DB /var/lib/molly/payments.db
			env TZ UTC
		}
		tool_steps 6
	}`)
	v, err := parseGlobal(d, nil)
	if err != nil {
		t.Fatal(err)
	}
	var a App
	if err := json.Unmarshal(v.(httpcaddyfile.App).Value, &a); err != nil {
		t.Fatal(err)
	}
	want := plugins.Config{Name: "payments", Path: "/opt/molly/payments",
		SHA256: "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
		Env:    map[string]string{"MOLLY_PAYMENTS_DB": "/var/lib/molly/payments.db", "TZ": "UTC"}}
	if len(a.Tools) != 1 || a.ToolSteps != 6 {
		t.Fatalf("tools %+v, steps %d", a.Tools, a.ToolSteps)
	}
	got := a.Tools[0]
	if got.Name != want.Name || got.Path != want.Path || got.SHA256 != want.SHA256 || len(got.Env) != 2 ||
		got.Env["MOLLY_PAYMENTS_DB"] != want.Env["MOLLY_PAYMENTS_DB"] || got.Env["TZ"] != "UTC" {
		t.Fatalf("tool = %+v, want %+v", got, want)
	}
}

func TestCaddyfileToolErrors(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"molly {\n tool\n}", "tool needs a name"},
		{"molly {\n tool t {\n path /x\n }\n}", `tool "t" needs a name, a path and a sha256`},
		{"molly {\n tool t {\n colour red\n }\n}", `unrecognized subdirective "colour"`},
		{"molly {\n tool t {\n env ONLY\n }\n}", "env needs a name and a value"},
		{"molly {\n tool_steps 0\n}", "want a positive integer"},
	} {
		_, err := parseGlobal(caddyfile.NewTestDispenser(c.in), nil)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: error %v, want %q", c.in, err, c.want)
		}
	}
}
