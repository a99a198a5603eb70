package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"time"

	"github.com/molly-gateway/molly/plugins"
	"github.com/molly-gateway/molly/plugins/sqlstore"
)

// Ledger is the billing book of record: one row per usage event (a gateway
// decision) and the idempotency records, in one SQLite file opened as the
// payments ledger is (modernc.org/sqlite, WAL, synchronous=NORMAL: a
// committed call survives kill -9; see registry/sqlite for the reasoning).
//
// Costs are non-negative integer nano-USD (1 USD = 1e9 nano-USD): integers
// add exactly, and a per-token price of a fraction of a cent still has
// room (USD 0.15 per million tokens is 150 nano-USD per token).
type Ledger struct {
	db  *sql.DB
	now func() time.Time
}

const ledgerSchema = `
CREATE TABLE IF NOT EXISTS usage (
	decision_id       TEXT PRIMARY KEY,       -- the gateway's routing decision id
	member            TEXT NOT NULL,          -- Molly member billed
	model             TEXT NOT NULL,
	tier              TEXT NOT NULL,
	target            TEXT NOT NULL DEFAULT '', -- upstream or local target that served it
	prompt_tokens     INTEGER NOT NULL CHECK (prompt_tokens >= 0),
	completion_tokens INTEGER NOT NULL CHECK (completion_tokens >= 0),
	cost_nano_usd     INTEGER NOT NULL CHECK (cost_nano_usd >= 0),
	at                INTEGER NOT NULL,       -- unix ms of the event
	recorded_by       TEXT NOT NULL,          -- caller member that recorded it
	created           INTEGER NOT NULL        -- unix ms
);
CREATE INDEX IF NOT EXISTS usage_member_at ON usage(member, at);
`

// OpenLedger opens (creating if needed) the ledger file at path.
func OpenLedger(path string) (*Ledger, error) {
	db, err := sqlstore.Open(path, ledgerSchema)
	if err != nil {
		return nil, fmt.Errorf("ledger: %w", err)
	}
	return &Ledger{db: db, now: time.Now}, nil
}

// Close closes the file.
func (l *Ledger) Close() error { return l.db.Close() }

// Usage is one recorded usage event. Tokens are counts; CostNanoUSD is
// nano-USD; At and Created are unix ms.
type Usage struct {
	DecisionID       string `json:"decision_id"`
	Member           string `json:"member"`
	Model            string `json:"model"`
	Tier             string `json:"tier"`
	Target           string `json:"target,omitempty"`
	PromptTokens     int64  `json:"prompt_tokens"`
	CompletionTokens int64  `json:"completion_tokens"`
	CostNanoUSD      int64  `json:"cost_nano_usd"`
	At               int64  `json:"at"`
}

// Line is an aggregate of usage events: an invoice line (per model and
// tier), a usage row (per model, tier and target) or a total (all empty).
// CostUSD is CostNanoUSD as a decimal string with nine fractional digits.
type Line struct {
	Model            string `json:"model,omitempty"`
	Tier             string `json:"tier,omitempty"`
	Target           string `json:"target,omitempty"`
	Events           int64  `json:"events"`
	PromptTokens     int64  `json:"prompt_tokens"`
	CompletionTokens int64  `json:"completion_tokens"`
	CostNanoUSD      int64  `json:"cost_nano_usd"`
	CostUSD          string `json:"cost_usd"`
}

// Idempotent runs fn in one transaction keyed by (member, key): the first
// call runs fn, stores its JSON result with reqHash and commits; a later
// call with the same key and hash returns the stored bytes without running
// fn; the same key with another hash is a "conflict" tool error. A failing
// fn stores nothing (its effects roll back), so a retry runs it again.
// (The payments ledger's scheme, unchanged.)
func (l *Ledger) Idempotent(ctx context.Context, member, key, reqHash string, fn func(tx *sql.Tx) (any, error)) (json.RawMessage, error) {
	return sqlstore.Idempotent(ctx, l.db, l.now(), "ledger", member, key, reqHash, fn)
}

// InsertUsage stores u, recorded by the caller member by. A decision id
// already in the ledger (recorded by another caller, so not caught by the
// idempotency record) is a "conflict" tool error.
func (l *Ledger) InsertUsage(ctx context.Context, tx *sql.Tx, u *Usage, by string) error {
	var n int
	if err := tx.QueryRowContext(ctx, `SELECT COUNT(*) FROM usage WHERE decision_id = ?`, u.DecisionID).Scan(&n); err != nil {
		return internal(err)
	}
	if n > 0 {
		return plugins.Errorf(plugins.CodeConflict, "decision %q is already recorded", u.DecisionID)
	}
	_, err := tx.ExecContext(ctx, `INSERT INTO usage (decision_id, member, model, tier, target, prompt_tokens, completion_tokens, cost_nano_usd, at, recorded_by, created)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`, u.DecisionID, u.Member, u.Model, u.Tier, u.Target, u.PromptTokens, u.CompletionTokens,
		u.CostNanoUSD, u.At, by, l.now().UnixMilli())
	if err != nil {
		return internal(err)
	}
	return nil
}

// Aggregate sums member's usage with from <= at < to (unix ms) grouped by
// the given columns (a subset of model, tier, target, in that order; none
// gives one total line, also when there is no usage). Lines are sorted by
// the grouping columns.
func (l *Ledger) Aggregate(ctx context.Context, member string, from, to int64, groupBy ...string) ([]Line, error) {
	cols := map[string]bool{}
	for _, c := range groupBy {
		cols[c] = true
	}
	sel := func(c string) string {
		if cols[c] {
			return c
		}
		return "''"
	}
	q := `SELECT ` + sel("model") + `, ` + sel("tier") + `, ` + sel("target") + `, COUNT(*), COALESCE(SUM(prompt_tokens), 0),
		COALESCE(SUM(completion_tokens), 0), COALESCE(SUM(cost_nano_usd), 0) FROM usage WHERE member = ? AND at >= ? AND at < ?`
	if len(groupBy) > 0 {
		q += ` GROUP BY 1, 2, 3 ORDER BY 1, 2, 3`
	}
	rows, err := l.db.QueryContext(ctx, q, member, from, to)
	if err != nil {
		return nil, internal(err)
	}
	defer rows.Close()
	out := []Line{}
	for rows.Next() {
		var ln Line
		if err := rows.Scan(&ln.Model, &ln.Tier, &ln.Target, &ln.Events, &ln.PromptTokens, &ln.CompletionTokens, &ln.CostNanoUSD); err != nil {
			return nil, internal(err)
		}
		ln.CostUSD = formatUSD(ln.CostNanoUSD)
		out = append(out, ln)
	}
	if err := rows.Err(); err != nil {
		return nil, internal(err)
	}
	return out, nil
}

// formatUSD writes nano-USD n >= 0 as a decimal USD string with nine
// fractional digits: 1234500000 → "1.234500000".
func formatUSD(n int64) string {
	return fmt.Sprintf("%d.%09d", n/1e9, n%1e9)
}

func internal(err error) error {
	return plugins.Errorf(plugins.CodeInternal, "ledger: %v", err)
}
