package registry

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// BenchmarkRecord measures Record as the gateway calls it after every
// answer (a member without a budget, as "anonymous", no reservation, a
// fresh decision id per record) with one recorder (c=1: the latency a
// request pays) and with 16 at once (c=16: records per second), against
// the implementation it replaced (recordSerial below: one transaction per
// record with five statements) on a file of its own, in the same run:
// rounds of 100 records per recorder alternate between the two (ABBA),
// and each figure is the median over rounds. b.N is the number of
// records per implementation. Reported: µs of wall time per record for
// each, and grouped's records per second over serial's.
func BenchmarkRecord(b *testing.B) {
	for _, c := range []int{1, 16} {
		b.Run(fmt.Sprintf("c=%d", c), func(b *testing.B) { benchRecord(b, c) })
	}
}

func benchRecord(b *testing.B, c int) {
	ctx := context.Background()
	impls := [2]func(context.Context, Usage) (string, error){}
	for i := range impls {
		r, err := Open(filepath.Join(b.TempDir(), fmt.Sprintf("molly-%d.db", i)), Options{})
		if err != nil {
			b.Fatal(err)
		}
		defer r.Close()
		impls[i] = r.Record
		if i == 0 {
			impls[i] = r.recordSerial
			for _, query := range []string{oldMemberPeriod, oldDecisionRecords, oldInsertUsage, oldAddSpend, oldQueue} {
				s, err := r.db.Prepare(query) // prepared, as they were (before any use of r.stmts)
				if err != nil {
					b.Fatal(err)
				}
				r.stmts[query] = s
			}
		}
	}
	const perRound = 100 // records per recorder and round
	var n atomic.Int64
	round := func(record func(context.Context, Usage) (string, error)) float64 {
		start := time.Now()
		var wg sync.WaitGroup
		for range c {
			wg.Go(func() {
				for range perRound {
					i := n.Add(1)
					u := Usage{Member: "anonymous", DecisionID: "d-" + strconv.FormatInt(i, 10), Model: "m", Target: "t", Tier: "T1",
						PromptTokens: 100, CompletionTokens: 50, CostUSD: 0.0003, Time: time.Now()}
					if _, err := record(ctx, u); err != nil {
						b.Error(err)
					}
				}
			})
		}
		wg.Wait()
		return float64(time.Since(start).Microseconds()) / float64(c*perRound)
	}
	rounds := max(1, b.N/(c*perRound))
	var per [2][]float64
	b.ResetTimer()
	for k := range rounds {
		for _, i := range abbaOrder(k) {
			per[i] = append(per[i], round(impls[i]))
		}
	}
	serial, grouped := median(per[0]), median(per[1])
	b.ReportMetric(serial, "serial_us/record")
	b.ReportMetric(grouped, "grouped_us/record")
	b.ReportMetric(serial/grouped, "speedup")
}

// abbaOrder is the order of the two sides in round k: A then B, then B
// then A, so that neither always runs on a machine its partner warmed.
func abbaOrder(k int) [2]int {
	if k%2 == 1 {
		return [2]int{1, 0}
	}
	return [2]int{0, 1}
}

func median(v []float64) float64 {
	slices.Sort(v)
	if len(v)%2 == 1 {
		return v[len(v)/2]
	}
	return (v[len(v)/2-1] + v[len(v)/2]) / 2
}

// recordSerial is Record as it was before group commit (one IMMEDIATE
// transaction per record: the member's period, the record id, the usage
// row, the spend counter, the settlement and the outbox as separate
// statements), kept as the benchmark's baseline.
func (r *Registry) recordSerial(ctx context.Context, u Usage) (string, error) {
	if u.Member == "" || u.PromptTokens < 0 || u.CompletionTokens < 0 || u.CostUSD < 0 {
		return "", fmt.Errorf("usage for %q: member, non-negative tokens and cost are required: %w", u.Member, ErrInvalid)
	}
	est := 0
	if u.Estimated {
		est = 1
	}
	cost := nusd(u.CostUSD)
	var id string
	err := r.txq(ctx, func(tx q) error {
		commit := r.now()
		if u.Time.Before(commit) {
			u.Time = commit
		}
		at, now := ms(u.Time), ms(commit)
		var m Member
		var anchor int64
		err := tx.row(oldMemberPeriod, u.Member).Scan(&m.Period, &anchor)
		if err != nil && !errors.Is(err, sql.ErrNoRows) {
			return err
		}
		m.PeriodStart = fromMS(anchor)
		start := periodKey(&m, u.Time)
		var n int
		if err := tx.row(oldDecisionRecords, u.DecisionID).Scan(&n); err != nil {
			return err
		}
		id = u.DecisionID
		if n > 0 {
			id = fmt.Sprintf("%s:%d", u.DecisionID, n+1)
		}
		if _, err := tx.exec(oldInsertUsage,
			id, u.Member, u.DecisionID, u.Model, u.Target, u.Tier, u.PromptTokens, u.CompletionTokens, est, cost, at); err != nil {
			return err
		}
		if _, err := tx.exec(oldAddSpend,
			u.Member, start, cost, u.PromptTokens, u.CompletionTokens); err != nil {
			return err
		}
		_, err = tx.exec(oldQueue, id, now, now)
		return err
	})
	if err != nil {
		return "", fmt.Errorf("registry: recording usage for %s: %w", u.Member, err)
	}
	r.nudge()
	return id, nil
}

// The statements of recordSerial, prepared like the registry's own.
const (
	oldMemberPeriod    = `SELECT period, period_start FROM members WHERE name = ?`
	oldDecisionRecords = `SELECT COUNT(*) FROM usage WHERE decision_id = ?`
	oldInsertUsage     = `INSERT INTO usage (record_id, member, decision_id, model, target, tier, prompt_tokens, completion_tokens, estimated, cost_nusd, ts)
			VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`
	oldAddSpend = `INSERT INTO spend (member, period_start, spent_nusd, prompt_tokens, completion_tokens, records)
			VALUES (?, ?, ?, ?, ?, 1)
			ON CONFLICT (member, period_start) DO UPDATE SET spent_nusd = spend.spent_nusd + excluded.spent_nusd,
				prompt_tokens = spend.prompt_tokens + excluded.prompt_tokens,
				completion_tokens = spend.completion_tokens + excluded.completion_tokens, records = spend.records + 1`
	oldQueue = `INSERT INTO outbox (sink, record_id, next_at, created) SELECT name, ?, ?, ? FROM outbox_sinks`
)

// BenchmarkRecordTail measures the latency of single Record calls (one
// recorder, as a lone request pays it) on a registry file opened as Open
// does (wal_autocheckpoint AutoCheckpointPages) against the same file
// settings with SQLite's default checkpoint threshold (1000 pages), in the
// same run: rounds of 500 records alternate between the two (ABBA).
// Reported: each one's median and 99th percentile (µs) over all rounds.
func BenchmarkRecordTail(b *testing.B) {
	ctx := context.Background()
	var regs [2]*Registry
	for i := range regs {
		r, err := Open(filepath.Join(b.TempDir(), fmt.Sprintf("molly-%d.db", i)), Options{})
		if err != nil {
			b.Fatal(err)
		}
		defer r.Close()
		regs[i] = r
	}
	// The baseline: SQLite's default threshold on its one connection.
	if _, err := regs[0].db.Exec(`PRAGMA wal_autocheckpoint = 1000`); err != nil {
		b.Fatal(err)
	}
	const perRound = 500
	var n int
	var lat [2][]time.Duration
	rounds := max(2, b.N/perRound)
	b.ResetTimer()
	for k := range rounds {
		for _, i := range abbaOrder(k) {
			for range perRound {
				n++
				u := Usage{Member: "anonymous", DecisionID: "d-" + strconv.Itoa(n), Model: "m", Target: "t", Tier: "T1",
					PromptTokens: 100, CompletionTokens: 50, CostUSD: 0.0003, Time: time.Now()}
				start := time.Now()
				if _, err := regs[i].Record(ctx, u); err != nil {
					b.Fatal(err)
				}
				lat[i] = append(lat[i], time.Since(start))
			}
		}
	}
	b.StopTimer()
	q := func(v []time.Duration, p float64) float64 {
		slices.Sort(v)
		return float64(v[int(p*float64(len(v)-1))].Nanoseconds()) / 1e3
	}
	b.ReportMetric(q(lat[0], 0.5), "default_p50_us")
	b.ReportMetric(q(lat[0], 0.99), "default_p99_us")
	b.ReportMetric(q(lat[1], 0.5), "p50_us")
	b.ReportMetric(q(lat[1], 0.99), "p99_us")
}
