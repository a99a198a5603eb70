package app

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/molly-gateway/molly/registry"
	"github.com/molly-gateway/molly/router"
)

func TestRecordUsageArgs(t *testing.T) {
	u := registry.Usage{RecordID: "d-1:2", Member: "alice", DecisionID: "d-1", Model: "chat", Target: "lan", Tier: "T1", PromptTokens: 5, CompletionTokens: 4,
		CostUSD: 90e-6, Time: time.Date(2026, 11, 30, 10, 0, 0, 5_000_000, time.FixedZone("X", 3600))}
	want := `{"at":"2026-11-30T09:00:00.005Z","completion_tokens":4,"cost_nano_usd":90000,"decision_id":"d-1:2","member":"alice",` +
		`"model":"chat","op":"record_usage","prompt_tokens":5,"target":"lan","tier":"T1"}`
	if got := string(recordUsageArgs(u)); got != want {
		t.Fatalf("got  %s\nwant %s", got, want)
	}
}

// usageRunner answers every call with its err and records the calls.
type usageRunner struct {
	calls *[]string
	err   error
}

func (usageRunner) Tools() []router.ToolSpec { return nil }

func (r usageRunner) Invoke(ctx context.Context, name string, args []byte, member string, scopes []string, key string) ([]byte, error) {
	*r.calls = append(*r.calls, name+" "+member+" "+key)
	if r.err != nil {
		return nil, r.err
	}
	return []byte(`{}`), nil
}

func TestTheUsageSinkCallsTheToolAndTellsRetriesFromRefusals(t *testing.T) {
	u := registry.Usage{RecordID: "d-1:2", Member: "alice", DecisionID: "d-1", Model: "chat", Target: "lan", Tier: "T1", PromptTokens: 1}
	for _, tc := range []struct {
		name      string
		err       error
		ok        bool
		permanent bool
	}{
		{"an acknowledgement", nil, true, false},
		{"a plugin down is retried", &router.ToolError{Code: "unavailable", Message: "restarting"}, false, false},
		{"a storage failure is retried", &router.ToolError{Code: "internal", Message: "disk"}, false, false},
		{"a timeout is retried", context.DeadlineExceeded, false, false},
		{"a record id booked with other values is refused for good", &router.ToolError{Code: "conflict", Message: "other values"}, false, true},
		{"invalid arguments are refused for good", &router.ToolError{Code: "invalid_argument", Message: "member"}, false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var calls []string
			err := usageSink(usageRunner{calls: &calls, err: tc.err}, "billing")(context.Background(), u)
			if (err == nil) != tc.ok || registry.IsPermanent(err) != tc.permanent {
				t.Fatalf("err %v (permanent %v), want ok %v permanent %v", err, registry.IsPermanent(err), tc.ok, tc.permanent)
			}
			if len(calls) != 1 || calls[0] != "billing molly-gateway d-1:2" {
				t.Fatalf("calls %q: want one call as molly-gateway with the record id as key", calls)
			}
		})
	}
}

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
