package registry

import (
	"context"
	"database/sql"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"reflect"
	"testing"
	"time"
)

// TestRecordBatchIsRecordInOneByOne: random batches of records (decisions
// with several records, in the ledger already and within the batch,
// members with and without a budget period, reservations, two sinks) leave
// the same rows in every table — usage (record ids and order), spend,
// reservations, outbox — whether written by recordBatch or by recordIn one
// record at a time, the implementation it replaces, on a file of its own.
func TestRecordBatchIsRecordInOneByOne(t *testing.T) {
	ctx := context.Background()
	c := &clock{t: t0}
	var regs [2]*Registry
	var res [2][]int64
	for i := range regs {
		regs[i] = open(t, filepath.Join(t.TempDir(), "molly.db"), c)
		r := regs[i]
		put(t, r, Member{Name: "daily", BudgetUSD: 5, Period: PeriodDay})
		put(t, r, Member{Name: "monthly", BudgetUSD: 5, Period: PeriodMonth, TPM: 1 << 30})
		put(t, r, Member{Name: "plain"})
		for _, s := range []string{"billing", "audit"} {
			if err := r.RegisterSink(ctx, s); err != nil {
				t.Fatal(err)
			}
		}
		for range 3 {
			m, _ := r.Member(ctx, "monthly")
			rv, err := r.Reserve(ctx, m, 5000, 0.5)
			if err != nil {
				t.Fatal(err)
			}
			res[i] = append(res[i], rv.ID)
		}
	}
	rng := rand.New(rand.NewPCG(3, 9))
	members := []string{"daily", "monthly", "plain", "unknown"}
	// The first two batches are fixed: ten decisions new to the ledger, then
	// 64 new ones (the first chunk of the insert, which succeeds) followed by
	// a new decision's second record and records of two of the first
	// batch's decisions, in the 4-row chunk after it and the 2-row chunk
	// after that (so ids are numbered again from a chunk in the middle).
	fixed := [][]string{{"e0", "e1", "e2", "e3", "e4", "e5", "e6", "e7", "e8", "e9"}}
	var second []string
	for k := range 64 {
		second = append(second, fmt.Sprintf("n%d", k))
	}
	fixed = append(fixed, append(second, "n5", "x", "e3", "y", "e3", "e7"))
	for batch := range 42 {
		n := 1 + rng.IntN(30)
		if batch%3 == 2 { // past the largest multi-row chunk (64 rows), with more decisions than one IN list takes
			n = 65 + rng.IntN(200)
		}
		if batch < len(fixed) {
			n = len(fixed[batch])
		}
		us := make([]Usage, n)
		held := make([]int, n) // the reservation each record settles, an index into res[file]; -1 none
		for k := range us {
			us[k] = Usage{Member: members[rng.IntN(len(members))], DecisionID: fmt.Sprintf("d%d", rng.IntN(25+n/2)),
				Model: "m", Target: "t", Tier: "T1", PromptTokens: rng.IntN(500), CompletionTokens: rng.IntN(500),
				Estimated: rng.IntN(2) == 0, CostUSD: float64(rng.IntN(1000)) * 1e-6,
				Time: c.now().Add(time.Duration(rng.IntN(5)-2) * time.Hour)}
			if batch < len(fixed) {
				us[k].DecisionID = fixed[batch][k]
			}
			held[k] = -1
			if us[k].Member == "monthly" && rng.IntN(2) == 0 {
				held[k] = rng.IntN(3)
			}
		}
		for i, r := range regs {
			mine := make([]Usage, n)
			for k, u := range us {
				if held[k] >= 0 {
					u.Reservation = res[i][held[k]]
				}
				mine[k] = u
			}
			err := r.txq(ctx, func(tx q) error {
				if i == 0 {
					ids, err := r.recordBatch(tx, mine)
					if err == nil && len(ids) != n {
						err = fmt.Errorf("%d ids for %d records", len(ids), n)
					}
					return err
				}
				for _, u := range mine {
					if _, err := r.recordIn(tx, u); err != nil {
						return err
					}
				}
				return nil
			})
			if err != nil {
				t.Fatalf("batch %d on file %d: %v", batch, i, err)
			}
		}
		if batch == 0 {
			// As if another handle on the file had written the first batch:
			// the second's records of e3 and e7 are not decisions this
			// handle knows, and the insert's unique index finds them.
			regs[0].recent.mu.Lock()
			regs[0].recent.cur, regs[0].recent.old = nil, nil
			regs[0].recent.mu.Unlock()
		}
		c.add(time.Duration(rng.IntN(3)) * time.Hour)
	}
	sameLedgers(t, regs[0], regs[1], "batch", "one by one", `SELECT member, nusd, tokens FROM reservations ORDER BY id`)
	// The oracle's own numbering of the second batch's records of e3.
	for _, id := range []string{"e3:2", "e3:3", "n5:2", "e7:2"} {
		var n int
		if err := regs[0].db.QueryRow(`SELECT COUNT(*) FROM usage WHERE record_id = ?`, id).Scan(&n); err != nil || n != 1 {
			t.Fatalf("record %s: %d rows, %v; want 1", id, n, err)
		}
	}
}

// TestRecordBatchFailsWhereRecordInFails: a decision whose first record id
// is taken by another decision's record (decision "x" has "x" and "x:2";
// then decision "x:2" comes) fails the batch as it fails recordIn, and
// the failed transaction leaves the ledger as it was.
func TestRecordBatchFailsWhereRecordInFails(t *testing.T) {
	ctx := context.Background()
	r := open(t, filepath.Join(t.TempDir(), "molly.db"), &clock{t: t0})
	u := func(d string) Usage { return Usage{Member: "m", DecisionID: d, PromptTokens: 1, CostUSD: 1e-6} }
	if err := r.txq(ctx, func(tx q) error { _, err := r.recordBatch(tx, []Usage{u("x"), u("x")}); return err }); err != nil {
		t.Fatal(err)
	}
	one := r.txq(ctx, func(tx q) error { _, err := r.recordIn(tx, u("x:2")); return err })
	batch := r.txq(ctx, func(tx q) error { _, err := r.recordBatch(tx, []Usage{u("a"), u("x:2"), u("b")}); return err })
	if one == nil || batch == nil {
		t.Fatalf("recordIn: %v; recordBatch: %v; want both to fail on the taken record id", one, batch)
	}
	var n int
	if err := r.db.QueryRow(`SELECT COUNT(*) FROM usage`).Scan(&n); err != nil || n != 2 {
		t.Fatalf("%d usage rows (%v) after the failed batch, want the 2 before", n, err)
	}
}

// sameLedgers fails t unless a's and b's usage, spend, outbox and
// reservations (read by reservations) rows are the same, and there are some.
func sameLedgers(t *testing.T, a, b *Registry, aName, bName, reservations string) {
	t.Helper()
	for _, query := range []string{
		`SELECT id, record_id, member, decision_id, model, target, tier, prompt_tokens, completion_tokens, estimated, cost_nusd, ts FROM usage ORDER BY id`,
		`SELECT member, period_start, spent_nusd, prompt_tokens, completion_tokens, records FROM spend ORDER BY member, period_start`,
		reservations,
		`SELECT sink, record_id, state, next_at, created FROM outbox ORDER BY sink, record_id`,
	} {
		x, y := dump(t, a.db, query), dump(t, b.db, query)
		if len(x) == 0 {
			t.Fatalf("%s: no rows", query)
		}
		if !reflect.DeepEqual(x, y) {
			t.Fatalf("%s:\n%s %v\n%s %v", query, aName, x, bName, y)
		}
	}
}

func dump(t *testing.T, db *sql.DB, query string) [][]any {
	t.Helper()
	rows, err := db.Query(query)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	cols, _ := rows.Columns()
	var out [][]any
	for rows.Next() {
		vals := make([]any, len(cols))
		ptrs := make([]any, len(cols))
		for i := range vals {
			ptrs[i] = &vals[i]
		}
		if err := rows.Scan(ptrs...); err != nil {
			t.Fatal(err)
		}
		out = append(out, vals)
	}
	return out
}

// TestJournalWritesWhatRecordWrites: one sequence of records (decisions
// with several records, within a commit group and across groups, members
// with and without a budget period, reservations settled and then
// released, two sinks) leaves the same rows in usage, spend, reservations
// and outbox when each goes through Record, one committed transaction
// per record (the oracle), as when they go through Journal and its
// committer's groups (cut at random points by CommitJournal; the clock
// moves only once both are committed).
func TestJournalWritesWhatRecordWrites(t *testing.T) {
	ctx := context.Background()
	c := &clock{t: t0}
	var regs [2]*Registry
	for i := range regs {
		regs[i] = open(t, filepath.Join(t.TempDir(), "molly.db"), c)
		put(t, regs[i], Member{Name: "daily", BudgetUSD: 5, Period: PeriodDay})
		put(t, regs[i], Member{Name: "monthly", BudgetUSD: 50, Period: PeriodMonth, TPM: 1 << 30})
		put(t, regs[i], Member{Name: "plain"})
		for _, s := range []string{"billing", "audit"} {
			if err := regs[i].RegisterSink(ctx, s); err != nil {
				t.Fatal(err)
			}
		}
	}
	rng := rand.New(rand.NewPCG(5, 7))
	members := []string{"daily", "monthly", "plain", "unknown"}
	for step := range 12 {
		var res [2]*Reservation
		for i, r := range regs {
			m, _ := r.Member(ctx, "monthly")
			rv, err := r.Reserve(ctx, m, 5000, 0.5)
			if err != nil {
				t.Fatal(err)
			}
			res[i] = rv
		}
		n := 1 + rng.IntN(150)
		for k := range n {
			u := Usage{Member: members[rng.IntN(len(members))], DecisionID: fmt.Sprintf("d%d", rng.IntN(40+step*20)),
				Model: "m", Target: "t", Tier: "T1", PromptTokens: rng.IntN(500), CompletionTokens: rng.IntN(500),
				Estimated: rng.IntN(2) == 0, CostUSD: float64(rng.IntN(1000)) * 1e-6,
				Time: c.now().Add(time.Duration(rng.IntN(5)-2) * time.Hour)}
			settles := u.Member == "monthly" && rng.IntN(2) == 0
			for i, r := range regs {
				if settles {
					u.Reservation = res[i].ID
				}
				if i == 0 {
					if _, err := r.Record(ctx, u); err != nil {
						t.Fatal(err)
					}
				} else if err := r.Journal(ctx, u); err != nil {
					t.Fatal(err)
				}
			}
			if k%(1+rng.IntN(70)) == 0 {
				if err := regs[1].CommitJournal(ctx); err != nil {
					t.Fatal(err)
				}
			}
		}
		if step%2 == 0 {
			for i := range regs {
				if err := res[i].Release(ctx); err != nil {
					t.Fatal(err)
				}
			}
		}
		// Committed before the clock moves: a record's commit time is its
		// time when later (Usage.Time), as it is Record's.
		if err := regs[1].CommitJournal(ctx); err != nil {
			t.Fatal(err)
		}
		c.add(time.Duration(rng.IntN(3)) * time.Hour)
	}
	sameLedgers(t, regs[0], regs[1], "Record", "Journal", `SELECT id, member, nusd, tokens FROM reservations ORDER BY id`)
}
