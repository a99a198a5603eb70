package registry

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"
)

// Usage is one record of the ledger: what one answer (or one attempt of a
// request: a cascade's step, a mixture's member, a tool round) consumed.
type Usage struct {
	// RecordID is the record's durable id, assigned by Record inside its
	// transaction: the decision id for the decision's first record,
	// "<decision id>:<n>" for its n-th, "usage-<n>" for a record without a
	// decision id. The billing tool books one record per id (its
	// idempotency key), so a redelivery never books twice.
	RecordID   string `json:"record_id,omitempty"`
	Member     string `json:"member"`
	DecisionID string `json:"decision_id"` // the policy decision id (X-Molly-Decision-Id)
	Model      string `json:"model"`       // the client's model name
	Target     string `json:"target"`      // the target that answered
	Tier       string `json:"tier"`        // that target's tier, "T0".."T3"
	// PromptTokens and CompletionTokens as the upstream reported them, or as
	// Molly counted them when it did not (Estimated).
	PromptTokens     int  `json:"prompt_tokens"`
	CompletionTokens int  `json:"completion_tokens"`
	Estimated        bool `json:"estimated,omitempty"`
	// CostUSD is tokens × the target's prices (USD per 1M tokens); stored to
	// the nano-USD (NanoUSD).
	CostUSD float64 `json:"cost_usd"`
	// Time is when the usage happened. The ledger keeps the later of Time
	// and the commit (read under the write lock), to the millisecond: the
	// TPM window and the budget period of a record are those of its commit,
	// so admissions and records of every process see one order of time.
	Time time.Time `json:"time"`
	// Reservation, when not 0, is the Reservation.ID this record settles:
	// in the same transaction its held cost and tokens shrink by the
	// record's (not below 0), since the record now counts them.
	Reservation int64 `json:"-"`
}

// Record appends u to the ledger and returns its record id once committed,
// so the caller may acknowledge the request afterwards. In the same
// transaction it adds u to the member's spend counter of the period holding
// u.Time, settles u.Reservation, and queues the record in the outbox of
// every registered sink (RegisterSink). Its tokens count towards the
// member's TPM window from u.Time. Errors: ErrInvalid for a usage without a
// member or with negative numbers; ctx's error when ctx ends before the
// record joins a commit (nothing is recorded); database errors (nothing is
// recorded).
//
// On SQLite, records of concurrent callers are group-committed (commit.go):
// the records waiting at the moment a transaction begins share it, and each
// caller returns once the commit that includes its record is done. A record
// that has joined a commit is waited for even when ctx ends meanwhile, so
// an error always means that nothing was recorded. On PostgreSQL every
// record is its own transaction under its member's advisory lock.
func (r *Registry) Record(ctx context.Context, u Usage) (string, error) {
	if u.Member == "" || u.PromptTokens < 0 || u.CompletionTokens < 0 || u.CostUSD < 0 {
		return "", fmt.Errorf("usage for %q: member, non-negative tokens and cost are required: %w", u.Member, ErrInvalid)
	}
	if r.pg {
		return r.recordAlone(ctx, u)
	}
	return r.group.record(ctx, r, u)
}

// recordAlone records u in a transaction of its own, under the member's
// advisory lock (and the record-numbering one without a decision id) on
// PostgreSQL.
func (r *Registry) recordAlone(ctx context.Context, u Usage) (string, error) {
	var id string
	err := r.txq(ctx, func(tx q) error {
		if err := tx.lock(memberLock(u.Member)); err != nil {
			return err
		}
		if u.DecisionID == "" {
			if err := tx.lock(recordIDLock); err != nil {
				return err
			}
		}
		var err error
		id, err = r.recordIn(tx, u)
		return err
	})
	if err != nil {
		return "", fmt.Errorf("registry: recording usage for %s: %w", u.Member, err)
	}
	r.nudge()
	return id, nil
}

// recordIn writes u inside tx, which holds the write lock (and, on
// PostgreSQL, the advisory locks): three statements, four with a
// reservation. The usage row's insert numbers the record (Usage.RecordID's
// scheme, read in the same statement) and returns the member's period, so
// that the spend counter of the period holding u.Time is the one charged;
// then the spend counter, the settlement, the outbox rows.
func (r *Registry) recordIn(tx q, u Usage) (string, error) { return r.recordAs(tx, u, r.owner, false) }

// recordAs is recordIn for records of owner's reservations; keepTime keeps
// u.Time even when it is before the commit (a dead process's journal,
// replayed later: the usage belongs to when it happened, its period and
// its minute).
func (r *Registry) recordAs(tx q, u Usage, owner string, keepTime bool) (string, error) {
	est := 0
	if u.Estimated {
		est = 1
	}
	cost := nusd(u.CostUSD)
	// The clock is read under the write lock, so that records and
	// admissions of every process see time in their commit order.
	commit := r.now()
	if u.Time.Before(commit) && !(keepTime && !u.Time.IsZero()) {
		u.Time = commit
	}
	at, now := ms(u.Time), ms(commit)
	var id string
	var m Member
	var period sql.NullString
	var anchor sql.NullInt64
	var row scanner
	if u.DecisionID == "" {
		row = tx.row(qInsertUsageNumbered,
			u.Member, u.Model, u.Target, u.Tier, u.PromptTokens, u.CompletionTokens, est, cost, at, u.Member, u.Member)
	} else {
		row = tx.row(qInsertUsage,
			u.DecisionID, u.DecisionID, u.DecisionID, u.Member, u.DecisionID, u.Model, u.Target, u.Tier, u.PromptTokens, u.CompletionTokens, est, cost, at,
			u.Member, u.Member)
	}
	if err := row.Scan(&id, &period, &anchor); err != nil {
		return "", err
	}
	m.Period, m.PeriodStart = period.String, fromMS(anchor.Int64)
	if _, err := tx.exec(qAddSpend,
		u.Member, periodKey(&m, u.Time), cost, u.PromptTokens, u.CompletionTokens); err != nil {
		return "", err
	}
	if u.Reservation != 0 {
		tokens := int64(u.PromptTokens) + int64(u.CompletionTokens)
		if _, err := tx.exec(qSettle, cost, cost, tokens, tokens, u.Reservation, owner); err != nil {
			return "", err
		}
	}
	if _, err := tx.exec(qQueue, id, now, now); err != nil {
		return "", err
	}
	return id, nil
}

// Remaining returns m's budget left in the current period in USD (≤ 0 when
// spent) and whether m has a budget at all. It reads the period's spend
// counter (one row), not the ledger.
func (r *Registry) Remaining(ctx context.Context, m Member) (remaining float64, budgeted bool, err error) {
	if m.BudgetUSD <= 0 {
		return 0, false, nil
	}
	if err := r.syncJournal(ctx); err != nil {
		return 0, true, err
	}
	spent, err := r.spent(r.row(ctx, spentQuery, m.Name, periodKey(&m, r.now())), m)
	if err != nil {
		return 0, true, err
	}
	return usd(nusd(m.BudgetUSD) - spent), true, nil
}

// spentQuery reads a member's spend counter of one period (member, period_start).
const spentQuery = `SELECT spent_nusd FROM spend WHERE member = ? AND period_start = ?`

// spent scans m's spend counter (spentQuery's row) in nano-USD; no row is 0.
func (r *Registry) spent(row scanner, m Member) (int64, error) {
	var n int64
	err := row.Scan(&n)
	if err != nil && !errors.Is(err, sql.ErrNoRows) {
		return 0, fmt.Errorf("registry: reading the spend of %s: %w", m.Name, err)
	}
	return n, nil
}

// Summary is a member's usage in the current budget period, as the admin
// API returns it.
type Summary struct {
	Member           string    `json:"member"`
	Period           string    `json:"period,omitempty"`
	PeriodStart      time.Time `json:"period_start,omitzero"`
	PeriodEnd        time.Time `json:"period_end,omitzero"`
	BudgetUSD        float64   `json:"budget_usd,omitempty"`
	SpentUSD         float64   `json:"spent_usd"`
	RemainingUSD     *float64  `json:"remaining_usd,omitempty"` // absent without a budget
	Requests         int       `json:"requests"`                // usage records
	PromptTokens     int       `json:"prompt_tokens"`
	CompletionTokens int       `json:"completion_tokens"`
	// Recent holds the latest entries of the period, newest first.
	Recent []Usage `json:"recent"`
}

// Summarize returns member's usage in the current period (its spend
// counter) with up to recent latest entries. Errors: ErrNotFound for an
// unknown member.
func (r *Registry) Summarize(ctx context.Context, member string, recent int) (Summary, error) {
	if err := r.syncJournal(ctx); err != nil {
		return Summary{}, err
	}
	m, err := r.Member(ctx, member)
	if err != nil {
		return Summary{}, err
	}
	now := r.now()
	start, end := m.PeriodAt(now)
	s := Summary{Member: m.Name, Period: m.Period, PeriodStart: start, PeriodEnd: end, BudgetUSD: m.BudgetUSD, Recent: []Usage{}}
	var spent int64
	err = r.db.QueryRowContext(ctx, `SELECT spent_nusd, records, prompt_tokens, completion_tokens FROM spend WHERE member = ? AND period_start = ?`,
		m.Name, periodKey(&m, now)).Scan(&spent, &s.Requests, &s.PromptTokens, &s.CompletionTokens)
	if err != nil && !errors.Is(err, sql.ErrNoRows) {
		return Summary{}, fmt.Errorf("registry: reading the spend of %s: %w", m.Name, err)
	}
	s.SpentUSD = usd(spent)
	if m.BudgetUSD > 0 {
		left := usd(nusd(m.BudgetUSD) - spent)
		s.RemainingUSD = &left
	}
	from := int64(0)
	if m.Period != PeriodNone {
		from = ms(start)
	}
	rows, err := r.db.QueryContext(ctx, `SELECT `+usageCols+` FROM usage WHERE member = ? AND ts >= ? ORDER BY ts DESC, id DESC LIMIT ?`, m.Name, from, recent)
	if err != nil {
		return Summary{}, fmt.Errorf("registry: reading usage of %s: %w", m.Name, err)
	}
	defer rows.Close()
	for rows.Next() {
		u, err := scanUsage(rows)
		if err != nil {
			return Summary{}, fmt.Errorf("registry: reading usage of %s: %w", m.Name, err)
		}
		s.Recent = append(s.Recent, u)
	}
	return s, rows.Err()
}

const usageCols = `id, record_id, member, decision_id, model, target, tier, prompt_tokens, completion_tokens, estimated, cost_nusd, ts`

func scanUsage(row interface{ Scan(...any) error }) (Usage, error) {
	var u Usage
	var seq, cost, ts int64
	if err := row.Scan(&seq, &u.RecordID, &u.Member, &u.DecisionID, &u.Model, &u.Target, &u.Tier, &u.PromptTokens, &u.CompletionTokens,
		&u.Estimated, &cost, &ts); err != nil {
		return Usage{}, err
	}
	u.CostUSD, u.Time = usd(cost), fromMS(ts)
	return u, nil
}

// UsageRecords returns up to limit records of the ledger after the one at
// position after (0: from the start), in the order they were committed,
// with the position of the last one returned (pass it as after for the
// next page). For audits and for comparing the ledger with the billing
// tool's, record for record.
func (r *Registry) UsageRecords(ctx context.Context, after int64, limit int) ([]Usage, int64, error) {
	if err := r.syncJournal(ctx); err != nil {
		return nil, after, err
	}
	rows, err := r.db.QueryContext(ctx, `SELECT `+usageCols+` FROM usage WHERE id > ? ORDER BY id LIMIT ?`, after, limit)
	if err != nil {
		return nil, after, fmt.Errorf("registry: listing usage: %w", err)
	}
	defer rows.Close()
	out := []Usage{}
	last := after
	for rows.Next() {
		var u Usage
		var seq, cost, ts int64
		if err := rows.Scan(&seq, &u.RecordID, &u.Member, &u.DecisionID, &u.Model, &u.Target, &u.Tier, &u.PromptTokens, &u.CompletionTokens,
			&u.Estimated, &cost, &ts); err != nil {
			return nil, after, fmt.Errorf("registry: listing usage: %w", err)
		}
		u.CostUSD, u.Time = usd(cost), fromMS(ts)
		out, last = append(out, u), seq
	}
	return out, last, rows.Err()
}
