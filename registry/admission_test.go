package registry

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestTwoHandlesOnOneFileCannotOvershootTogether: two Registry handles on
// one file, as two gateway processes would have, admit together exactly
// what one budget and one TPM allow.
func TestTwoHandlesOnOneFileCannotOvershootTogether(t *testing.T) {
	ctx := context.Background()
	path := locate(t)
	c := &clock{t: t0}
	a, b := open(t, path, c), open(t, path, c)
	budget := put(t, a, Member{Name: "shared-budget", BudgetUSD: 1})
	tpm := put(t, a, Member{Name: "shared-tpm", TPM: 1000})
	for _, tc := range []struct {
		name          string
		m             Member
		tokens        int
		usd           float64
		want          int
		wantBudget429 bool
	}{
		{"a budget of 1 USD admits ten holds of 0.1 between both", budget, 1, 0.1, 10, true},
		{"a TPM of 1000 admits four holds of 250 between both", tpm, 250, 0, 4, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var admitted, refused atomic.Int32
			var wg sync.WaitGroup
			start := make(chan struct{})
			for i := range 40 {
				h := a
				if i%2 == 1 {
					h = b
				}
				wg.Add(1)
				go func() {
					defer wg.Done()
					<-start
					_, err := h.Reserve(ctx, tc.m, tc.tokens, tc.usd)
					var ob *OverBudget
					var lim *Limited
					switch {
					case err == nil:
						admitted.Add(1)
					case tc.wantBudget429 && errors.As(err, &ob), !tc.wantBudget429 && errors.As(err, &lim):
						refused.Add(1)
					default:
						t.Error(err)
					}
				}()
			}
			close(start)
			wg.Wait()
			if admitted.Load() != int32(tc.want) || refused.Load() != int32(40-tc.want) {
				t.Fatalf("admitted %d, refused %d; want %d and %d", admitted.Load(), refused.Load(), tc.want, 40-tc.want)
			}
		})
	}
}

// TestNoRequestShapeOvershootsTheBudgetOrTheTPM is the admission property:
// 50 concurrent clients on two handles of one file send requests of random
// shapes (prompt, n, max_tokens, cascade attempts, mixture members), each
// reserving its worst case and recording at most that, while the clock
// moves on. Whatever happens, the ledger — read here with SQL of its own,
// the oracle — never shows a period's spend above the budget nor a trailing
// minute's tokens above the TPM.
//
// It runs with the records committed by Record and with them journaled by
// Journal (releases then journaled too, after them).
func TestNoRequestShapeOvershootsTheBudgetOrTheTPM(t *testing.T) {
	for _, journal := range []bool{false, true} {
		name := "Record"
		if journal {
			name = "Journal"
		}
		t.Run(name, func(t *testing.T) { noRequestShapeOvershoots(t, journal) })
	}
}

func noRequestShapeOvershoots(t *testing.T, journal bool) {
	ctx := context.Background()
	path := locate(t)
	c := &clock{t: t0}
	// The clients move the fake clock by up to 3 s per step, 50 of them at
	// once, while leases are renewed on a real-time ticker (every lease/4):
	// a client descheduled between its Reserve and its Release would see
	// its reservation expire in fake time and its hold vanish, which no
	// live process allows. A lease longer than the whole run's fake time
	// keeps the property about admission, not about renewal.
	openLong := func() *Registry {
		r, err := Open(path, Options{Now: c.now, Lease: 24 * time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { r.Close() })
		return r
	}
	handles := []*Registry{openLong(), openLong()}
	members := []Member{
		put(t, handles[0], Member{Name: "m1", BudgetUSD: 0.05, Period: PeriodDay, TPM: 6000}),
		put(t, handles[0], Member{Name: "m2", BudgetUSD: 0.02, Period: PeriodDay, TPM: 2500}),
	}
	const priceIn, priceOut = 1.0, 4.0 // USD per 1M tokens
	cost := func(p, c int) float64 { return (float64(p)*priceIn + float64(c)*priceOut) / 1e6 }

	clients, requests := 50, 12
	if testing.Short() {
		clients, requests = 50, 4
	}
	var admitted, overBudget, overTPM, tooLarge, records atomic.Int64
	var wg sync.WaitGroup
	for client := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(client), 7))
			for req := range requests {
				h := handles[rng.IntN(2)]
				m := members[rng.IntN(2)]
				prompt := 1 + rng.IntN(300)
				n := 1 + rng.IntN(4)
				if rng.IntN(10) == 0 {
					n = 128 // n multiplies the work
				}
				maxTokens := 1 + rng.IntN(200)
				attempts := (1 + rng.IntN(3)) * (1 + rng.IntN(2)) // cascade attempts × mixture members
				worstTokens := attempts * (prompt + n*maxTokens)
				res, err := h.Reserve(ctx, m, worstTokens, float64(attempts)*cost(prompt, n*maxTokens))
				var ob *OverBudget
				var lim *Limited
				switch {
				case err == nil:
					admitted.Add(1)
				case errors.As(err, &ob):
					overBudget.Add(1)
					continue
				case errors.As(err, &lim) && lim.TooLarge:
					if worstTokens <= m.TPM {
						t.Errorf("a %d-token request refused as too large for TPM %d", worstTokens, m.TPM)
					}
					tooLarge.Add(1)
					continue
				case errors.As(err, &lim):
					overTPM.Add(1)
					c.add(time.Duration(rng.IntN(3000)) * time.Millisecond)
					continue
				default:
					t.Error(err)
					return
				}
				// Some requests fail outright; the others record up to
				// `attempts` answers, each within its share of the worst case.
				if rng.IntN(5) > 0 {
					for k := range 1 + rng.IntN(attempts) {
						u := Usage{Member: m.Name, DecisionID: fmt.Sprintf("c%d-r%d", client, req), Model: "m", Target: "t", Tier: "T3",
							PromptTokens: prompt, CompletionTokens: rng.IntN(n*maxTokens + 1), Reservation: res.ID}
						u.CostUSD = cost(u.PromptTokens, u.CompletionTokens)
						var err error
						if journal {
							err = h.Journal(ctx, u)
						} else {
							_, err = h.Record(ctx, u)
						}
						if err != nil {
							t.Error(err)
						}
						records.Add(1)
						_ = k
					}
				}
				if err := res.Release(ctx); err != nil {
					t.Error(err)
				}
				c.add(time.Duration(rng.IntN(1500)) * time.Millisecond)
			}
		}()
	}
	wg.Wait()
	t.Logf("admitted %d, refused over budget %d, over TPM %d, too large %d; %d records",
		admitted.Load(), overBudget.Load(), overTPM.Load(), tooLarge.Load(), records.Load())
	if admitted.Load() == 0 || overBudget.Load() == 0 || overTPM.Load() == 0 || tooLarge.Load() == 0 {
		t.Fatal("every kind of outcome must occur for the property to mean something")
	}

	for _, h := range handles { // the journals' entries committed
		if err := h.syncJournal(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if journal && !handles[0].pg && handles[0].JournalStats().Applied == 0 {
		t.Fatal("nothing went through the journal")
	}

	// The oracle: the ledger's rows, summed here.
	for _, m := range members {
		rows, err := handles[1].db.Query(`SELECT ts, prompt_tokens + completion_tokens, cost_nusd FROM usage WHERE member = ? ORDER BY ts`, m.Name)
		if err != nil {
			t.Fatal(err)
		}
		type rec struct{ ts, tokens, nusd int64 }
		var recs []rec
		for rows.Next() {
			var r rec
			if err := rows.Scan(&r.ts, &r.tokens, &r.nusd); err != nil {
				t.Fatal(err)
			}
			recs = append(recs, r)
		}
		rows.Close()
		spent := map[time.Time]int64{}
		for _, r := range recs {
			start, _ := m.PeriodAt(time.UnixMilli(r.ts))
			spent[start] += r.nusd
		}
		for start, n := range spent {
			if n > NanoUSD(m.BudgetUSD) {
				t.Errorf("%s spent %d nano-USD in the period from %v, over the budget of %d", m.Name, n, start, NanoUSD(m.BudgetUSD))
			}
			var counter int64
			if err := handles[0].db.QueryRow(`SELECT spent_nusd FROM spend WHERE member = ? AND period_start = ?`, m.Name, start.UnixMilli()).Scan(&counter); err != nil || counter != n {
				t.Errorf("%s: the spend counter holds %d, the ledger sums %d (%v)", m.Name, counter, n, err)
			}
		}
		// Every trailing minute ending at a record: (ts − 60 s, ts].
		sort.Slice(recs, func(i, j int) bool { return recs[i].ts < recs[j].ts })
		var window int64
		lo := 0
		for hi, r := range recs {
			window += r.tokens
			for recs[lo].ts <= r.ts-RateWindow.Milliseconds() {
				window -= recs[lo].tokens
				lo++
			}
			if window > int64(m.TPM) {
				t.Fatalf("%s: %d tokens in the minute ending at record %d (ts %d), over the TPM of %d", m.Name, window, hi, r.ts, m.TPM)
			}
		}
	}
}
