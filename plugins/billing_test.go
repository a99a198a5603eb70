package plugins_test

import (
	"context"
	"encoding/json"
	"os"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/molly-gateway/molly/plugins"
)

func billingConfig(t *testing.T) plugins.Config {
	return plugins.Config{Name: "billing", Path: billingBin, SHA256: billingSum,
		Env: map[string]string{"MOLLY_BILLING_DB": t.TempDir() + "/billing.db"}}
}

// invokeAs calls tool as member (invoke calls as alice).
func invokeAs(t *testing.T, m *plugins.Manager, tool, member, key string, args any) (json.RawMessage, error) {
	t.Helper()
	b, err := json.Marshal(args)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return m.Invoke(ctx, tool, plugins.Invocation{Args: b, Caller: plugins.Caller{Member: member, Scopes: []string{"tools:" + tool}}, IdempotencyKey: key})
}

// billingLine mirrors the billing tool's Line.
type billingLine struct {
	Model            string `json:"model,omitempty"`
	Tier             string `json:"tier,omitempty"`
	Target           string `json:"target,omitempty"`
	Events           int64  `json:"events"`
	PromptTokens     int64  `json:"prompt_tokens"`
	CompletionTokens int64  `json:"completion_tokens"`
	CostNanoUSD      int64  `json:"cost_nano_usd"`
	CostUSD          string `json:"cost_usd"`
}

type billingResult struct {
	Usage *struct {
		DecisionID  string `json:"decision_id"`
		Member      string `json:"member"`
		CostNanoUSD int64  `json:"cost_nano_usd"`
		At          int64  `json:"at"`
	} `json:"usage"`
	Invoice *struct {
		Member string        `json:"member"`
		Period string        `json:"period"`
		Lines  []billingLine `json:"lines"`
		Total  billingLine   `json:"total"`
	} `json:"invoice"`
	CSV     string        `json:"csv"`
	Member  string        `json:"member"`
	Period  string        `json:"period"`
	Lines   []billingLine `json:"lines"`
	Balance *billingLine  `json:"balance"`
}

func bill(t *testing.T, m *plugins.Manager, key string, args map[string]any) (billingResult, json.RawMessage, error) {
	t.Helper()
	raw, err := invokeAs(t, m, "billing", "gateway", key, args)
	var r billingResult
	if err == nil {
		if jerr := json.Unmarshal(raw, &r); jerr != nil {
			t.Fatalf("result %s: %v", raw, jerr)
		}
	}
	return r, raw, err
}

// usageEvent is a record_usage call's arguments.
func usageEvent(decision, member, model, tier, target string, prompt, completion, nanoUSD int64, at string) map[string]any {
	return map[string]any{"op": "record_usage", "decision_id": decision, "member": member, "model": model, "tier": tier,
		"target": target, "prompt_tokens": prompt, "completion_tokens": completion, "cost_nano_usd": nanoUSD, "at": at}
}

func TestUsageRecordedTwiceWithTheSameDecisionIDCountsOnce(t *testing.T) {
	m := newManager(t, billingConfig(t))
	ev := usageEvent("dec-1", "carol", "llama-3-8b", "standard", "local", 1200, 300, 450_000, "2026-11-03T10:00:00Z")
	_, first, err := bill(t, m, "", ev)
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name string
		key  string
		args map[string]any
		same bool   // the result is the first one, byte for byte
		code string // or this tool error
	}{
		{"the same event again returns the first result", "", ev, true, ""},
		{"the same event with the decision id as idempotency key returns the first result", "dec-1", ev, true, ""},
		{"the same decision id with another cost is a conflict",
			"", usageEvent("dec-1", "carol", "llama-3-8b", "standard", "local", 1200, 300, 450_001, "2026-11-03T10:00:00Z"), false, plugins.CodeConflict},
		{"an idempotency key other than the decision id is refused", "other", ev, false, plugins.CodeInvalidArgument},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, raw, err := bill(t, m, c.key, c.args)
			switch {
			case c.code != "":
				if !isCode(err, c.code) {
					t.Errorf("got %s, %v; want a %s tool error", raw, err, c.code)
				}
			case err != nil:
				t.Fatal(err)
			case c.same && string(raw) != string(first):
				t.Errorf("got %s, want the first result %s", raw, first)
			}
		})
	}
	// Another caller recording the same decision is refused by the ledger
	// itself (the idempotency record is per caller).
	if raw, err := invokeAs(t, m, "billing", "gateway-2", "", ev); !isCode(err, plugins.CodeConflict) {
		t.Errorf("a second caller recording dec-1 got %s, %v; want a conflict", raw, err)
	}
	r, _, err := bill(t, m, "", map[string]any{"op": "balance", "member": "carol"})
	if err != nil {
		t.Fatal(err)
	}
	want := billingLine{Events: 1, PromptTokens: 1200, CompletionTokens: 300, CostNanoUSD: 450_000, CostUSD: "0.000450000"}
	if r.Member != "carol" || r.Balance == nil || *r.Balance != want {
		t.Errorf("balance of %s: %+v, want %+v", r.Member, r.Balance, want)
	}
}

func TestAnInvoiceTotalsAMembersMonthExactly(t *testing.T) {
	m := newManager(t, billingConfig(t))
	for _, ev := range []map[string]any{
		usageEvent("d1", "alice", "llama-3-8b", "standard", "local", 1000, 200, 150_000_000, "2026-11-01T00:00:00Z"),
		usageEvent("d2", "alice", "gpt-4o", "premium", "openai", 500, 100, 2_500_000_000, "2026-11-15T12:30:00+02:00"),
		usageEvent("d3", "alice", "llama-3-8b", "standard", "remote-a", 3000, 700, 350_000_001, "2026-11-30T23:59:59.999Z"),
		usageEvent("d4", "alice", "llama-3-8b", "standard", "local", 9, 9, 9, "2026-10-31T23:59:59.999Z"), // October
		usageEvent("d5", "alice", "llama-3-8b", "standard", "local", 8, 8, 8, "2026-12-01T00:00:00Z"),     // December
		usageEvent("d6", "bob", "gpt-4o", "premium", "openai", 7, 7, 7, "2026-11-10T00:00:00Z"),           // another member
	} {
		if _, raw, err := bill(t, m, "", ev); err != nil {
			t.Fatalf("recording %v: %s, %v", ev["decision_id"], raw, err)
		}
	}

	t.Run("the JSON invoice has a line per model and tier and their total", func(t *testing.T) {
		r, raw, err := bill(t, m, "", map[string]any{"op": "invoice", "member": "alice", "month": "2026-11"})
		if err != nil {
			t.Fatal(err)
		}
		wantLines := []billingLine{
			{Model: "gpt-4o", Tier: "premium", Events: 1, PromptTokens: 500, CompletionTokens: 100, CostNanoUSD: 2_500_000_000, CostUSD: "2.500000000"},
			{Model: "llama-3-8b", Tier: "standard", Events: 2, PromptTokens: 4000, CompletionTokens: 900, CostNanoUSD: 500_000_001, CostUSD: "0.500000001"},
		}
		wantTotal := billingLine{Events: 3, PromptTokens: 4500, CompletionTokens: 1000, CostNanoUSD: 3_000_000_001, CostUSD: "3.000000001"}
		in := r.Invoice
		if in == nil || in.Member != "alice" || in.Period != "2026-11" || !reflect.DeepEqual(in.Lines, wantLines) || in.Total != wantTotal {
			t.Errorf("invoice %s,\nwant lines %+v and total %+v", raw, wantLines, wantTotal)
		}
	})

	t.Run("the CSV invoice has the same lines, a header and a total row", func(t *testing.T) {
		r, raw, err := bill(t, m, "", map[string]any{"op": "invoice", "member": "alice", "month": "2026-11", "format": "csv"})
		if err != nil {
			t.Fatal(err)
		}
		want := strings.Join([]string{
			"member,period,kind,model,tier,events,prompt_tokens,completion_tokens,cost_nano_usd,cost_usd",
			"alice,2026-11,line,gpt-4o,premium,1,500,100,2500000000,2.500000000",
			"alice,2026-11,line,llama-3-8b,standard,2,4000,900,500000001,0.500000001",
			"alice,2026-11,total,,,3,4500,1000,3000000001,3.000000001",
			""}, "\n")
		if r.CSV != want || r.Invoice != nil {
			t.Errorf("result %s,\nwant only csv %q", raw, want)
		}
	})

	t.Run("a month without usage has no lines and a zero total", func(t *testing.T) {
		r, raw, err := bill(t, m, "", map[string]any{"op": "invoice", "member": "alice", "month": "2026-09"})
		if err != nil {
			t.Fatal(err)
		}
		if r.Invoice == nil || len(r.Invoice.Lines) != 0 || r.Invoice.Total != (billingLine{CostUSD: "0.000000000"}) {
			t.Errorf("invoice %s, want no lines and a zero total", raw)
		}
	})

	t.Run("usage breaks the month down by model, tier and target", func(t *testing.T) {
		r, raw, err := bill(t, m, "", map[string]any{"op": "usage", "member": "alice", "month": "2026-11"})
		if err != nil {
			t.Fatal(err)
		}
		want := []billingLine{
			{Model: "gpt-4o", Tier: "premium", Target: "openai", Events: 1, PromptTokens: 500, CompletionTokens: 100, CostNanoUSD: 2_500_000_000, CostUSD: "2.500000000"},
			{Model: "llama-3-8b", Tier: "standard", Target: "local", Events: 1, PromptTokens: 1000, CompletionTokens: 200, CostNanoUSD: 150_000_000, CostUSD: "0.150000000"},
			{Model: "llama-3-8b", Tier: "standard", Target: "remote-a", Events: 1, PromptTokens: 3000, CompletionTokens: 700, CostNanoUSD: 350_000_001, CostUSD: "0.350000001"},
		}
		if r.Member != "alice" || r.Period != "2026-11" || !reflect.DeepEqual(r.Lines, want) {
			t.Errorf("usage %s, want %+v", raw, want)
		}
	})

	t.Run("the balance is everything charged to date, every month", func(t *testing.T) {
		r, raw, err := bill(t, m, "", map[string]any{"op": "balance", "member": "alice"})
		if err != nil {
			t.Fatal(err)
		}
		want := billingLine{Events: 5, PromptTokens: 4517, CompletionTokens: 1017, CostNanoUSD: 3_000_000_018, CostUSD: "3.000000018"}
		if r.Balance == nil || *r.Balance != want {
			t.Errorf("balance %s, want %+v", raw, want)
		}
	})

	t.Run("the member defaults to the caller", func(t *testing.T) {
		raw, err := invokeAs(t, m, "billing", "bob", "", map[string]any{"op": "balance"})
		if err != nil {
			t.Fatal(err)
		}
		if want := `{"member":"bob","balance":{"events":1,"prompt_tokens":7,"completion_tokens":7,"cost_nano_usd":7,"cost_usd":"0.000000007"}}`; string(raw) != want {
			t.Errorf("balance %s, want %s", raw, want)
		}
	})
}

func TestBillingRefusesBadCalls(t *testing.T) {
	m := newManager(t, billingConfig(t))
	ok := func() map[string]any {
		return usageEvent("d-ok", "alice", "m", "standard", "", 1, 1, 1, "2026-11-01T00:00:00Z")
	}
	with := func(k string, v any) map[string]any {
		a := ok()
		if v == nil {
			delete(a, k)
		} else {
			a[k] = v
		}
		return a
	}
	cases := []struct {
		name string
		args map[string]any
	}{
		{"a negative cost is refused", with("cost_nano_usd", -1)},
		{"a fractional cost is refused", with("cost_nano_usd", 0.5)},
		{"a cost as a decimal string is refused", with("cost_nano_usd", "0.01")},
		{"a missing cost is refused", with("cost_nano_usd", nil)},
		{"missing prompt tokens are refused", with("prompt_tokens", nil)},
		{"a missing model is refused", with("model", nil)},
		{"a malformed decision id is refused", with("decision_id", "has space")},
		{"a malformed member is refused", with("member", "a/b")},
		{"a time that is not RFC 3339 is refused", with("at", "yesterday")},
		{"a time before 1970 is refused", with("at", "1969-12-31T23:59:59Z")},
		{"an unknown argument is refused", with("currency", "USD")},
		{"an invoice month that is not YYYY-MM is refused", map[string]any{"op": "invoice", "month": "2026-13"}},
		{"an invoice in an unknown format is refused", map[string]any{"op": "invoice", "month": "2026-11", "format": "xml"}},
		{"a balance for one month is refused", map[string]any{"op": "balance", "month": "2026-11"}},
		{"a read with usage fields is refused", map[string]any{"op": "usage", "month": "2026-11", "model": "m"}},
		{"an unknown op is refused", map[string]any{"op": "refund"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if _, raw, err := bill(t, m, "", c.args); !isCode(err, plugins.CodeInvalidArgument) {
				t.Errorf("got %s, %v; want an invalid_argument tool error", raw, err)
			}
		})
	}
	r, _, err := bill(t, m, "", map[string]any{"op": "balance", "member": "alice"})
	if err != nil || r.Balance == nil || r.Balance.Events != 0 {
		t.Errorf("balance after refused calls only: %+v, %v; want no events", r.Balance, err)
	}
}

// TestToolPluginsSeeOnlyTheEnvironmentConfigGrants: the database path the
// host has in its own environment does not reach a plugin; the one config
// grants does, and nothing else of the host's.
func TestToolPluginsSeeOnlyTheEnvironmentConfigGrants(t *testing.T) {
	t.Setenv("MOLLY_BILLING_DB", t.TempDir()+"/host-billing.db")
	t.Setenv("MOLLY_SUPPORT_DB", t.TempDir()+"/host-support.db")
	t.Setenv("MOLLY_SECRET_OF_THE_HOST", "hunter2")
	for _, c := range []struct {
		name, bin, sum, envVar string
	}{
		{"billing", billingBin, billingSum, "MOLLY_BILLING_DB"},
		{"support", supportBin, supportSum, "MOLLY_SUPPORT_DB"},
	} {
		t.Run("the "+c.name+" plugin does not start on the host's "+c.envVar, func(t *testing.T) {
			m, err := plugins.NewManager([]plugins.Config{{Name: c.name, Path: c.bin, SHA256: c.sum}}, plugins.Options{
				Logger: hclog.NewNullLogger(), MinBackoff: 50 * time.Millisecond, StartTimeout: 5 * time.Second})
			if err == nil {
				m.Close()
				t.Fatalf("the %s plugin started without a granted %s", c.name, c.envVar)
			}
		})
		t.Run("the "+c.name+" plugin sees the granted "+c.envVar+" and nothing of the host's", func(t *testing.T) {
			granted := t.TempDir() + "/granted.db"
			m := newManager(t, plugins.Config{Name: c.name, Path: c.bin, SHA256: c.sum, Env: map[string]string{c.envVar: granted}})
			env, err := os.ReadFile("/proc/" + itoa(m.PIDs()[c.name]) + "/environ")
			if err != nil {
				t.Skipf("cannot read the plugin's environment: %v", err)
			}
			var got []string
			for _, v := range strings.Split(strings.TrimRight(string(env), "\x00"), "\x00") {
				if strings.HasPrefix(v, "MOLLY_") || strings.HasPrefix(v, "PATH=") || strings.HasPrefix(v, "HOME=") {
					got = append(got, v)
				}
			}
			want := []string{c.envVar + "=" + granted, plugins.Handshake.MagicCookieKey + "=" + plugins.Handshake.MagicCookieValue}
			if !sameSet(got, want) {
				t.Errorf("the plugin's MOLLY_/PATH/HOME variables are %q, want exactly %q", got, want)
			}
			if _, err := os.Stat(granted); err != nil {
				t.Errorf("the plugin did not open its database at the granted path: %v", err)
			}
		})
	}
}

func sameSet(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	seen := map[string]int{}
	for _, s := range a {
		seen[s]++
	}
	for _, s := range b {
		if seen[s] == 0 {
			return false
		}
		seen[s]--
	}
	return true
}
