package registry

import (
	"context"
	"database/sql"
	"fmt"
	"net/url"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

// The benchmarks measure one request's ledger work — Reserve, Record
// (settling the reservation), Release — on a member with a monthly budget
// and a TPM, on a ledger whose month is empty or already holds 10,000
// records. "durable" is this
// package; "baseline" is the implementation it replaced (the first registry), rebuilt
// below from its code: reservations and the TPM window in memory, the spend
// summed over the period's ledger rows on every admission, one INSERT per
// record, the same SQLite pragmas. Both run on the same clock, which moves
// 1 s per request (so a trailing minute holds 60 records).

var benchMember = Member{Name: "bench", BudgetUSD: 1e6, Period: PeriodMonth, PeriodStart: time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC), TPM: 1_000_000}

// prefill writes n records of the member into the current month, before t0.
func prefill(b *testing.B, db *sql.DB, n int, withRecordID bool) {
	b.Helper()
	tx, err := db.Begin()
	if err != nil {
		b.Fatal(err)
	}
	q := `INSERT INTO usage (member, decision_id, model, target, tier, prompt_tokens, completion_tokens, cost_nusd, ts) VALUES (?, ?, 'm', 't', 'T3', 10, 10, 1000, ?)`
	if withRecordID {
		q = `INSERT INTO usage (member, decision_id, record_id, model, target, tier, prompt_tokens, completion_tokens, cost_nusd, ts) VALUES (?, ?, ?, 'm', 't', 'T3', 10, 10, 1000, ?)`
	}
	for i := range n {
		id := fmt.Sprintf("old-%d", i)
		at := t0.Add(-time.Duration(n-i) * time.Minute).UnixMilli()
		var err error
		if withRecordID {
			_, err = tx.Exec(q, benchMember.Name, id, id, at)
		} else {
			_, err = tx.Exec(q, benchMember.Name, id, at)
		}
		if err != nil {
			b.Fatal(err)
		}
	}
	if err := tx.Commit(); err != nil {
		b.Fatal(err)
	}
}

func BenchmarkReserveRecordRelease(b *testing.B) {
	u := Usage{Member: benchMember.Name, Model: "m", Target: "t", Tier: "T3", PromptTokens: 100, CompletionTokens: 50, CostUSD: 0.0003}
	for _, month := range []int{0, 10_000} {
		b.Run(fmt.Sprintf("month=%d/impl=durable", month), func(b *testing.B) { benchDurable(b, month, u) })
		b.Run(fmt.Sprintf("month=%d/impl=baseline", month), func(b *testing.B) { benchBaseline(b, month, u) })
	}
}

func benchDurable(b *testing.B, month int, u Usage) {
	ctx := context.Background()
	{
		c := &clock{t: t0}
		r, err := Open(filepath.Join(b.TempDir(), "molly.db"), Options{Now: c.now})
		if err != nil {
			b.Fatal(err)
		}
		defer r.Close()
		prefill(b, r.db, month, true)
		m, _, err := r.PutMember(ctx, benchMember) // builds the month's counter from the prefill
		if err != nil {
			b.Fatal(err)
		}
		b.ResetTimer()
		for i := range b.N {
			res, err := r.Reserve(ctx, m, 400, 0.001)
			if err != nil {
				b.Fatal(err)
			}
			u.DecisionID, u.Reservation = fmt.Sprintf("d-%d", i), res.ID
			if _, err := r.Record(ctx, u); err != nil {
				b.Fatal(err)
			}
			if err := res.Release(ctx); err != nil {
				b.Fatal(err)
			}
			c.add(time.Second)
		}
	}
}

func benchBaseline(b *testing.B, month int, u Usage) {
	ctx := context.Background()
	{
		c := &clock{t: t0}
		l, err := openBaseline(filepath.Join(b.TempDir(), "molly.db"), c.now)
		if err != nil {
			b.Fatal(err)
		}
		defer l.db.Close()
		prefill(b, l.db, month, false)
		b.ResetTimer()
		for i := range b.N {
			release, err := l.reserve(ctx, benchMember, 400, 0.001)
			if err != nil {
				b.Fatal(err)
			}
			u.DecisionID = fmt.Sprintf("d-%d", i)
			if err := l.record(ctx, u); err != nil {
				b.Fatal(err)
			}
			release()
			c.add(time.Second)
		}
	}
}

// baseline is the first registry's ledger (registry/reserve.go, usage.go and
// limits.go before this change), reduced to what one request does.
type baseline struct {
	db  *sql.DB
	now func() time.Time

	mu     sync.Mutex
	tokens map[string][]tokenEntry // TPM window
	resMu  sync.Mutex
	held   map[string][2]int64 // nano-USD and tokens in flight
}

func openBaseline(path string, now func() time.Time) (*baseline, error) {
	q := url.Values{}
	for _, p := range []string{"journal_mode(WAL)", "synchronous(NORMAL)", "busy_timeout(5000)", "foreign_keys(1)"} {
		q.Add("_pragma", p)
	}
	db, err := sql.Open("sqlite", "file:"+path+"?"+q.Encode())
	if err != nil {
		return nil, err
	}
	db.SetMaxOpenConns(1)
	if _, err := db.Exec(schemaV1); err != nil {
		return nil, err
	}
	return &baseline{db: db, now: now, tokens: map[string][]tokenEntry{}, held: map[string][2]int64{}}, nil
}

func (l *baseline) reserve(ctx context.Context, m Member, tokens int, expected float64) (func(), error) {
	exp := nusd(expected)
	l.resMu.Lock()
	defer l.resMu.Unlock()
	h := l.held[m.Name]
	start, _ := m.PeriodAt(l.now())
	var spent int64
	if err := l.db.QueryRowContext(ctx, `SELECT COALESCE(SUM(cost_nusd), 0) FROM usage WHERE member = ? AND ts >= ?`, m.Name, ms(start)).Scan(&spent); err != nil {
		return nil, err
	}
	if spent+h[0]+exp > nusd(m.BudgetUSD) {
		return nil, &OverBudget{}
	}
	l.mu.Lock()
	now := l.now()
	w := l.tokens[m.Name]
	for len(w) > 0 && !w[0].at.After(now.Add(-RateWindow)) {
		w = w[1:]
	}
	l.tokens[m.Name] = w
	used := int(h[1])
	for _, e := range w {
		used += e.n
	}
	l.mu.Unlock()
	if used+tokens > m.TPM {
		return nil, &Limited{}
	}
	h[0], h[1] = h[0]+exp, h[1]+int64(tokens)
	l.held[m.Name] = h
	return func() {
		l.resMu.Lock()
		defer l.resMu.Unlock()
		h := l.held[m.Name]
		h[0], h[1] = h[0]-exp, h[1]-int64(tokens)
		l.held[m.Name] = h
	}, nil
}

func (l *baseline) record(ctx context.Context, u Usage) error {
	at := l.now()
	if _, err := l.db.ExecContext(ctx, `INSERT INTO usage (member, decision_id, model, target, tier, prompt_tokens, completion_tokens, estimated, cost_nusd, ts)
		VALUES (?, ?, ?, ?, ?, ?, ?, 0, ?, ?)`, u.Member, u.DecisionID, u.Model, u.Target, u.Tier, u.PromptTokens, u.CompletionTokens, nusd(u.CostUSD), ms(at)); err != nil {
		return err
	}
	l.mu.Lock()
	l.tokens[u.Member] = append(l.tokens[u.Member], tokenEntry{at, u.PromptTokens + u.CompletionTokens})
	l.mu.Unlock()
	return nil
}
