package registry

import (
	"context"
	"database/sql"
	"path/filepath"
	"reflect"
	"strconv"
	"testing"
	"time"

	"github.com/molly-gateway/molly/registry/sqlite"
)

func TestRecordIDsAreAssignedPerDecisionInTheTransaction(t *testing.T) {
	ctx := context.Background()
	path := locate(t)
	c := &clock{t: t0}
	r := open(t, path, c)
	rec := func(r *Registry, decision string) string {
		t.Helper()
		id, err := r.Record(ctx, Usage{Member: "a", DecisionID: decision, PromptTokens: 1})
		if err != nil {
			t.Fatal(err)
		}
		return id
	}
	got := []string{rec(r, "d1"), rec(r, "d2"), rec(r, "d1"), rec(r, "d1")}
	// A restart (a new handle on the file) continues the sequence: it lives in the file.
	r2 := open(t, path, c)
	got = append(got, rec(r2, "d1"), rec(r2, ""), rec(r, "d2"))
	want := []string{"d1", "d2", "d1:2", "d1:3", "d1:4", "usage-6", "d2:2"}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("record ids %v, want %v", got, want)
	}
	list, _, err := r2.UsageRecords(ctx, 0, 100)
	if err != nil || len(list) != len(want) {
		t.Fatalf("UsageRecords: %d, %v", len(list), err)
	}
	for i, u := range list {
		if u.RecordID != want[i] {
			t.Fatalf("record %d stored as %q, want %q", i, u.RecordID, want[i])
		}
	}
}

func TestTheSpendCounterEqualsTheLedgerPerPeriod(t *testing.T) {
	ctx := context.Background()
	c := &clock{t: t0}
	r := open(t, locate(t), c)
	m := put(t, r, Member{Name: "alice", BudgetUSD: 1, Period: PeriodDay})
	costs := []float64{0.1, 0.2, 0.3}
	for _, cost := range costs {
		if _, err := r.Record(ctx, Usage{Member: "alice", PromptTokens: 3, CompletionTokens: 4, CostUSD: cost}); err != nil {
			t.Fatal(err)
		}
	}
	// The oracle: the ledger's rows summed here, in nano-USD.
	var sum int64
	if err := r.db.QueryRow(`SELECT SUM(cost_nusd) FROM usage WHERE member = 'alice'`).Scan(&sum); err != nil {
		t.Fatal(err)
	}
	if sum != 600_000_000 {
		t.Fatalf("ledger sum %d nano-USD, want 600000000", sum)
	}
	left, _, err := r.Remaining(ctx, m)
	if err != nil || left != 0.4 {
		t.Fatalf("remaining %v (%v), want 0.4", left, err)
	}
	s, err := r.Summarize(ctx, "alice", 10)
	if err != nil || s.Requests != 3 || s.PromptTokens != 9 || s.CompletionTokens != 12 || s.SpentUSD != 0.6 || len(s.Recent) != 3 {
		t.Fatalf("summary %+v, %v", s, err)
	}
	// Changing the period anchor rebuilds the current period's counter from the ledger.
	c.add(time.Hour)
	m.PeriodStart = t0.Add(30 * time.Minute) // the period now starts after the three records
	if _, _, err := r.PutMember(ctx, m); err != nil {
		t.Fatal(err)
	}
	m, _ = r.Member(ctx, "alice")
	if left, _, _ := r.Remaining(ctx, m); left != 1 {
		t.Fatalf("after moving the period past the records, remaining %v, want 1", left)
	}
}

func TestTheRPMWindowSurvivesReopen(t *testing.T) {
	ctx := context.Background()
	path := locate(t)
	c := &clock{t: t0}
	r := open(t, path, c)
	m := put(t, r, Member{Name: "bob", RPM: 3})
	for i := range 3 {
		if lim, err := r.Admit(ctx, m); lim != nil || err != nil {
			t.Fatalf("request %d: %v %v", i+1, lim, err)
		}
		c.add(time.Second)
	}
	// A restart: a new handle (the old one never closed, as after kill -9).
	r2 := open(t, path, c)
	lim, err := r2.Admit(ctx, m)
	if err != nil || lim == nil || lim.Kind != "requests" || lim.Used != 3 || lim.RetryAfter != 57*time.Second {
		t.Fatalf("fourth request after the restart: %+v, %v; want a requests refusal for 57s", lim, err)
	}
	// And two processes share it: the first handle sees the same window.
	if lim, _ := r.Admit(ctx, m); lim == nil {
		t.Fatal("the other handle admitted a fourth request in the minute")
	}
	c.add(57 * time.Second)
	if lim, err := r2.Admit(ctx, m); lim != nil || err != nil {
		t.Fatalf("once the first request left the window: %v %v", lim, err)
	}
}

// TestAVersionOneFileIsUpgraded: a file written by the first registry
// (schema without versions) gets record ids in the same scheme, spend
// counters equal to its ledger, and keeps its members and keys.
func TestAVersionOneFileIsUpgraded(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "molly.db")
	old, err := sql.Open("sqlite", "file:"+path)
	if err != nil {
		t.Fatal(err)
	}
	day := time.Date(2026, 3, 15, 0, 0, 0, 0, time.UTC)
	if _, err := old.Exec(schemaV1); err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{
		`INSERT INTO members (name, budget_nusd, period, period_start, created) VALUES ('alice', 1000000000, 'day', ` + itoa(day.UnixMilli()) + `, 1)`,
		`INSERT INTO usage (member, decision_id, model, target, tier, prompt_tokens, completion_tokens, cost_nusd, ts) VALUES
			('alice', 'd1', 'm', 't', 'T1', 1, 2, 100, ` + itoa(day.Add(-time.Hour).UnixMilli()) + `),
			('alice', 'd1', 'm', 't', 'T1', 3, 4, 200, ` + itoa(t0.Add(-time.Hour).UnixMilli()) + `),
			('alice', '', 'm', 't', 'T1', 5, 6, 300, ` + itoa(t0.Add(-time.Minute).UnixMilli()) + `),
			('ghost', 'd2', 'm', 't', 'T1', 7, 8, 400, 5)`,
	} {
		if _, err := old.Exec(q); err != nil {
			t.Fatal(err)
		}
	}
	old.Close()

	r := open(t, path, &clock{t: t0})
	versions, err := sqlite.Applied(ctx, r.db)
	if err != nil || !reflect.DeepEqual(versions, []int{1, 2, 3, 4, 5}) {
		t.Fatalf("versions %v, %v", versions, err)
	}
	list, _, err := r.UsageRecords(ctx, 0, 10)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, u := range list {
		ids = append(ids, u.RecordID)
	}
	if want := []string{"d1", "d1:2", "usage-3", "d2"}; !reflect.DeepEqual(ids, want) {
		t.Fatalf("record ids %v, want %v", ids, want)
	}
	m, err := r.Member(ctx, "alice")
	if err != nil {
		t.Fatal(err)
	}
	// Today's period holds the 200 and 300 nano-USD records, not yesterday's 100.
	if left, _, _ := r.Remaining(ctx, m); NanoUSD(left) != 1e9-500 {
		t.Fatalf("remaining %v USD, want 1 USD − 500 nano-USD", left)
	}
	// The next record of d1 continues its sequence.
	if id, err := r.Record(ctx, Usage{Member: "alice", DecisionID: "d1", PromptTokens: 1}); err != nil || id != "d1:3" {
		t.Fatalf("next record of d1: %q, %v", id, err)
	}
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }
