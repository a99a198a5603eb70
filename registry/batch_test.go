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
	for batch := range 40 {
		n := 1 + rng.IntN(30)
		if batch%3 == 2 { // past the largest multi-row chunk (64 rows), with more decisions than one IN list takes
			n = 65 + rng.IntN(200)
		}
		us := make([]Usage, n)
		held := make([]int, n) // the reservation each record settles, an index into res[file]; -1 none
		for k := range us {
			us[k] = Usage{Member: members[rng.IntN(len(members))], DecisionID: fmt.Sprintf("d%d", rng.IntN(25+n/2)),
				Model: "m", Target: "t", Tier: "T1", PromptTokens: rng.IntN(500), CompletionTokens: rng.IntN(500),
				Estimated: rng.IntN(2) == 0, CostUSD: float64(rng.IntN(1000)) * 1e-6,
				Time: c.now().Add(time.Duration(rng.IntN(5)-2) * time.Hour)}
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
		c.add(time.Duration(rng.IntN(3)) * time.Hour)
	}
	for _, query := range []string{
		`SELECT id, record_id, member, decision_id, model, target, tier, prompt_tokens, completion_tokens, estimated, cost_nusd, ts FROM usage ORDER BY id`,
		`SELECT member, period_start, spent_nusd, prompt_tokens, completion_tokens, records FROM spend ORDER BY member, period_start`,
		`SELECT member, nusd, tokens FROM reservations ORDER BY id`,
		`SELECT sink, record_id, state, next_at, created FROM outbox ORDER BY sink, record_id`,
	} {
		a, b := dump(t, regs[0].db, query), dump(t, regs[1].db, query)
		if len(a) == 0 {
			t.Fatalf("%s: no rows", query)
		}
		if !reflect.DeepEqual(a, b) {
			t.Fatalf("%s:\nbatch      %v\none by one %v", query, a, b)
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
