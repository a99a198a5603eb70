package registry

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"
)

// Budget periods.
const (
	PeriodNone  = ""      // the budget covers all time
	PeriodDay   = "day"   // resets every 24 h from PeriodStart
	PeriodMonth = "month" // resets on PeriodStart's day of every month (clamped to the month's last day)
)

// Member is one caller of the gateway: a person, team or service that holds
// API keys. The JSON shape is the admin API's.
type Member struct {
	// Name identifies the member: 1–64 characters, no spaces.
	Name string `json:"name"`
	// BudgetUSD is the spend allowed per period in USD; 0 means no budget.
	BudgetUSD float64 `json:"budget_usd,omitempty"`
	// Period is "day", "month" or "" (the budget covers all time).
	Period string `json:"period,omitempty"`
	// PeriodStart anchors the periods (UTC); default: the start of the
	// current UTC day or month when the member is created.
	PeriodStart time.Time `json:"period_start,omitzero"`
	// RPM and TPM limit requests and tokens (prompt + completion) per
	// trailing minute; 0 means unlimited.
	RPM int `json:"rpm,omitempty"`
	TPM int `json:"tpm,omitempty"`
	// Scopes. Models lists the client model names the member may ask for (a
	// trailing "*" matches a prefix, e.g. "molly-demo:*"), Tiers the tiers
	// ("T0".."T3") requests may reach, Tools the function names requests may
	// declare. An empty list allows everything.
	Models []string `json:"models,omitempty"`
	Tiers  []string `json:"tiers,omitempty"`
	Tools  []string `json:"tools,omitempty"`
	// Created is when the member was first stored.
	Created time.Time `json:"created,omitzero"`
}

// Validate checks the fields; the error wraps ErrInvalid and names the field.
func (m *Member) Validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("member %q: %s: %w", m.Name, fmt.Sprintf(format, args...), ErrInvalid)
	}
	if m.Name == "" || len(m.Name) > 64 || strings.ContainsAny(m.Name, " \t\r\n/?#") {
		return bad("name must be 1-64 characters without spaces, '/', '?' or '#'")
	}
	if m.BudgetUSD < 0 || m.RPM < 0 || m.TPM < 0 {
		return bad("budget_usd, rpm and tpm must not be negative")
	}
	// Money is kept in whole nano-dollars in an int64: bound the budget so
	// it neither overflows nor rounds to 0 ("no budget").
	if m.BudgetUSD > 1e9 || m.BudgetUSD != 0 && m.BudgetUSD < 1e-6 || math.IsNaN(m.BudgetUSD) {
		return bad("budget_usd must be 0 (no budget) or between 0.000001 and 1000000000")
	}
	switch m.Period {
	case PeriodNone, PeriodDay, PeriodMonth:
	default:
		return bad("period %q must be day, month or empty", m.Period)
	}
	for _, t := range m.Tiers {
		if !slices.Contains([]string{"T0", "T1", "T2", "T3"}, t) {
			return bad("tier %q must be one of T0, T1, T2, T3", t)
		}
	}
	for _, list := range [][]string{m.Models, m.Tools} {
		for _, s := range list {
			if s == "" || strings.ContainsAny(s, " \t\r\n") {
				return bad("models and tools must be names without spaces, got %q", s)
			}
		}
	}
	return nil
}

// PeriodAt returns the budget period holding t: [start, end). For a member
// without a period, start is the zero time and end too (all time).
func (m *Member) PeriodAt(t time.Time) (start, end time.Time) {
	t = t.UTC()
	a := m.PeriodStart.UTC()
	switch m.Period {
	case PeriodDay:
		k := t.Sub(a) / (24 * time.Hour)
		if t.Before(a) && t.Sub(a)%(24*time.Hour) != 0 {
			k-- // floor, not truncation, before the anchor
		}
		start = a.Add(k * 24 * time.Hour)
		return start, start.Add(24 * time.Hour)
	case PeriodMonth:
		k := (t.Year()-a.Year())*12 + int(t.Month()) - int(a.Month())
		for addMonths(a, k).After(t) {
			k--
		}
		for !addMonths(a, k+1).After(t) {
			k++
		}
		return addMonths(a, k), addMonths(a, k+1)
	}
	return time.Time{}, time.Time{}
}

// periodKey is the spend counter's period_start of time t: the start of m's
// period holding t in unix ms, or 0 for a member without a period.
func periodKey(m *Member, t time.Time) int64 {
	if m.Period == PeriodNone {
		return 0
	}
	start, _ := m.PeriodAt(t)
	return ms(start)
}

// rebuildSpend sets m's spend counter of the period holding now to the sum
// of its usage records in that period.
func rebuildSpend(ctx context.Context, tx *sql.Tx, m *Member, now time.Time) error {
	from, to := int64(math.MinInt64), int64(math.MaxInt64)
	if m.Period != PeriodNone {
		start, end := m.PeriodAt(now)
		from, to = ms(start), ms(end)
	}
	_, err := tx.ExecContext(ctx, `INSERT INTO spend (member, period_start, spent_nusd, prompt_tokens, completion_tokens, records)
		SELECT ?, ?, COALESCE(SUM(cost_nusd), 0), COALESCE(SUM(prompt_tokens), 0), COALESCE(SUM(completion_tokens), 0), COUNT(*)
		FROM usage WHERE member = ? AND ts >= ? AND ts < ?
		ON CONFLICT (member, period_start) DO UPDATE SET spent_nusd = excluded.spent_nusd, prompt_tokens = excluded.prompt_tokens,
			completion_tokens = excluded.completion_tokens, records = excluded.records`,
		m.Name, periodKey(m, now), m.Name, from, to)
	return err
}

// addMonths moves a by k months, keeping its day of the month where the
// month has it and the month's last day otherwise (Jan 31 → Feb 28).
func addMonths(a time.Time, k int) time.Time {
	first := time.Date(a.Year(), a.Month()+time.Month(k), 1, a.Hour(), a.Minute(), a.Second(), a.Nanosecond(), time.UTC)
	last := first.AddDate(0, 1, -1).Day()
	return first.AddDate(0, 0, min(a.Day(), last)-1)
}

// PutMember creates the member or replaces its settings (keeping Created and
// its keys and usage). created reports a new member. A zero PeriodStart
// becomes the start of the current UTC day or month. Errors: ErrInvalid.
func (r *Registry) PutMember(ctx context.Context, m Member) (stored Member, created bool, err error) {
	if err := m.Validate(); err != nil {
		return Member{}, false, err
	}
	now := r.now().UTC()
	if m.PeriodStart.IsZero() {
		switch m.Period {
		case PeriodDay:
			m.PeriodStart = time.Date(now.Year(), now.Month(), now.Day(), 0, 0, 0, 0, time.UTC)
		case PeriodMonth:
			m.PeriodStart = time.Date(now.Year(), now.Month(), 1, 0, 0, 0, 0, time.UTC)
		}
	}
	m.PeriodStart = m.PeriodStart.UTC().Truncate(time.Millisecond)
	tx, err := r.db.BeginTx(ctx, nil)
	if err != nil {
		return Member{}, false, fmt.Errorf("registry: %w", err)
	}
	defer tx.Rollback()
	if err := r.lock(ctx, tx, memberLock(m.Name)); err != nil {
		return Member{}, false, fmt.Errorf("registry: %w", err)
	}
	var createdMS, oldStart int64
	var oldPeriod string
	err = tx.QueryRowContext(ctx, `SELECT created, period, period_start FROM members WHERE name = ?`, m.Name).Scan(&createdMS, &oldPeriod, &oldStart)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		created, createdMS = true, ms(now)
	case err != nil:
		return Member{}, false, fmt.Errorf("registry: reading member %s: %w", m.Name, err)
	}
	_, err = tx.ExecContext(ctx, `INSERT INTO members (name, budget_nusd, period, period_start, rpm, tpm, models, tiers, tools, created)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
		ON CONFLICT(name) DO UPDATE SET budget_nusd = excluded.budget_nusd, period = excluded.period,
			period_start = excluded.period_start, rpm = excluded.rpm, tpm = excluded.tpm,
			models = excluded.models, tiers = excluded.tiers, tools = excluded.tools`,
		m.Name, nusd(m.BudgetUSD), m.Period, ms(m.PeriodStart), m.RPM, m.TPM,
		strings.Join(m.Models, " "), strings.Join(m.Tiers, " "), strings.Join(m.Tools, " "), createdMS)
	if err != nil {
		return Member{}, false, fmt.Errorf("registry: storing member %s: %w", m.Name, err)
	}
	if created || oldPeriod != m.Period || oldStart != ms(m.PeriodStart) {
		// New periods: the current one's counter is summed once from the
		// ledger (usage recorded before, e.g. under the same name).
		if err := rebuildSpend(ctx, tx, &m, now); err != nil {
			return Member{}, false, fmt.Errorf("registry: storing member %s: %w", m.Name, err)
		}
	}
	if err := tx.Commit(); err != nil {
		return Member{}, false, fmt.Errorf("registry: storing member %s: %w", m.Name, err)
	}
	m.Created = fromMS(createdMS)
	return m, created, nil
}

const memberCols = `m.name, m.budget_nusd, m.period, m.period_start, m.rpm, m.tpm, m.models, m.tiers, m.tools, m.created`

func scanMember(row scanner, extra ...any) (Member, error) {
	var m Member
	var budget, start, created int64
	var models, tiers, tools string
	dest := append([]any{&m.Name, &budget, &m.Period, &start, &m.RPM, &m.TPM, &models, &tiers, &tools, &created}, extra...)
	if err := row.Scan(dest...); err != nil {
		return Member{}, err
	}
	m.BudgetUSD, m.PeriodStart, m.Created = usd(budget), fromMS(start), fromMS(created)
	m.Models, m.Tiers, m.Tools = words(models), words(tiers), words(tools)
	return m, nil
}

const memberQuery = `SELECT ` + memberCols + ` FROM members m WHERE m.name = ?`

// Member returns the member called name. Errors: ErrNotFound.
func (r *Registry) Member(ctx context.Context, name string) (Member, error) {
	m, err := scanMember(r.row(ctx, memberQuery, name))
	if errors.Is(err, sql.ErrNoRows) {
		return Member{}, fmt.Errorf("member %q: %w", name, ErrNotFound)
	}
	if err != nil {
		return Member{}, fmt.Errorf("registry: reading member %s: %w", name, err)
	}
	return m, nil
}

// Members returns every member, by name.
func (r *Registry) Members(ctx context.Context) ([]Member, error) {
	rows, err := r.db.QueryContext(ctx, `SELECT `+memberCols+` FROM members m ORDER BY m.name`)
	if err != nil {
		return nil, fmt.Errorf("registry: listing members: %w", err)
	}
	defer rows.Close()
	out := []Member{}
	for rows.Next() {
		m, err := scanMember(rows)
		if err != nil {
			return nil, fmt.Errorf("registry: listing members: %w", err)
		}
		out = append(out, m)
	}
	return out, rows.Err()
}
