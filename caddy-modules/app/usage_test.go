package app

import (
	"context"
	"encoding/json"
	"github.com/molly-gateway/molly/router/meter"
	"github.com/molly-gateway/molly/router/pipeline"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
)

func TestRecordUsageArgs(t *testing.T) {
	u := meter.Usage{Member: "alice", DecisionID: "d-1", Model: "chat", Target: "lan", Tier: "T1", PromptTokens: 5, CompletionTokens: 4,
		CostUSD: 90e-6, Time: time.Date(2026, 11, 30, 10, 0, 0, 5, time.FixedZone("X", 3600))}
	want := `{"at":"2026-11-30T09:00:00.000000005Z","completion_tokens":4,"cost_nano_usd":90000,"decision_id":"d-1","member":"alice",` +
		`"model":"chat","op":"record_usage","prompt_tokens":5,"target":"lan","tier":"T1"}`
	if got := string(recordUsageArgs(u)); got != want {
		t.Fatalf("got  %s\nwant %s", got, want)
	}
}

// usageRunner records calls; failing ones return err after the context ends.
type usageRunner struct {
	calls chan string
	fail  bool
}

func (usageRunner) Tools() []pipeline.ToolSpec { return nil }

func (r usageRunner) Invoke(ctx context.Context, name string, args []byte, member string, scopes []string, key string) ([]byte, error) {
	if r.fail {
		<-ctx.Done()
		r.calls <- name + " " + member + " " + key
		return nil, &pipeline.ToolError{Code: "unavailable", Message: "down"}
	}
	r.calls <- name + " " + member + " " + key
	return []byte(`{}`), nil
}

func TestUsageSender(t *testing.T) {
	u := meter.Usage{Member: "alice", DecisionID: "d-1", Model: "chat", Target: "lan", Tier: "T1", PromptTokens: 1, CostUSD: 1}
	t.Run("sent in the background with the decision id as key", func(t *testing.T) {
		r := usageRunner{calls: make(chan string, 1)}
		s := &usageSender{tool: "billing", runner: r, log: zap.NewNop(), timeout: time.Second, stats: new(UsageStats)}
		s.send(u)
		s.wait()
		if got := <-r.calls; got != "billing molly-gateway d-1" || s.stats.Sent.Load() != 1 || s.stats.Failed.Load() != 0 {
			t.Fatalf("call %q, sent %d, failed %d", got, s.stats.Sent.Load(), s.stats.Failed.Load())
		}
	})
	t.Run("a failure is bounded by the timeout, logged and counted, and does not block send", func(t *testing.T) {
		r := usageRunner{calls: make(chan string, 1), fail: true}
		core, logs := observer.New(zap.InfoLevel)
		s := &usageSender{tool: "billing", runner: r, log: zap.New(core), timeout: 50 * time.Millisecond, stats: new(UsageStats)}
		start := time.Now()
		s.send(u)
		if d := time.Since(start); d > 40*time.Millisecond {
			t.Fatalf("send blocked for %v", d)
		}
		s.wait()
		<-r.calls
		if s.stats.Failed.Load() != 1 || s.stats.Sent.Load() != 0 {
			t.Fatalf("sent %d, failed %d", s.stats.Sent.Load(), s.stats.Failed.Load())
		}
		e := logs.FilterMessage("recording usage in the usage tool failed").All()
		if len(e) != 1 || e[0].ContextMap()["decision_id"] != "d-1" || e[0].ContextMap()["error"] != "tool error unavailable: down" ||
			e[0].ContextMap()["failed_total"] != int64(1) {
			t.Fatalf("logs %+v", logs.All())
		}
	})
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

func TestEachUsageRecordOfADecisionGetsItsOwnID(t *testing.T) {
	s := &usageSender{}
	got := []string{s.recordID("d1"), s.recordID("d2"), s.recordID("d1"), s.recordID("d1")}
	want := []string{"d1", "d2", "d1:2", "d1:3"}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("record ids %v, want %v", got, want)
		}
	}
}
