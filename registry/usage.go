package registry

import (
	"context"
	"fmt"
	"time"
)

// Usage is one ledger entry: what one answered request consumed.
type Usage struct {
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
	// the nano-USD.
	CostUSD float64   `json:"cost_usd"`
	Time    time.Time `json:"time"` // default: now
}

// Record appends u to the ledger and returns once it is committed, so the
// caller may acknowledge the request afterwards. The tokens also count
// towards the member's TPM window. Errors: ErrInvalid for a usage without a
// member or with negative numbers; database errors.
func (r *Registry) Record(ctx context.Context, u Usage) error {
	if u.Member == "" || u.PromptTokens < 0 || u.CompletionTokens < 0 || u.CostUSD < 0 {
		return fmt.Errorf("usage for %q: member, non-negative tokens and cost are required: %w", u.Member, ErrInvalid)
	}
	if u.Time.IsZero() {
		u.Time = r.now()
	}
	est := 0
	if u.Estimated {
		est = 1
	}
	_, err := r.db.ExecContext(ctx, `INSERT INTO usage (member, decision_id, model, target, tier, prompt_tokens, completion_tokens, estimated, cost_nusd, ts)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
		u.Member, u.DecisionID, u.Model, u.Target, u.Tier, u.PromptTokens, u.CompletionTokens, est, nusd(u.CostUSD), ms(u.Time))
	if err != nil {
		return fmt.Errorf("registry: recording usage for %s: %w", u.Member, err)
	}
	r.addTokens(u.Member, u.Time, u.PromptTokens+u.CompletionTokens)
	return nil
}

// Remaining returns m's budget left in the current period in USD (≤ 0 when
// spent) and whether m has a budget at all.
func (r *Registry) Remaining(ctx context.Context, m Member) (remaining float64, budgeted bool, err error) {
	if m.BudgetUSD <= 0 {
		return 0, false, nil
	}
	start, _ := m.PeriodAt(r.now())
	var n int64
	err = r.db.QueryRowContext(ctx, `SELECT COALESCE(SUM(cost_nusd), 0) FROM usage WHERE member = ? AND ts >= ?`,
		m.Name, ms(start)).Scan(&n)
	if err != nil {
		return 0, true, fmt.Errorf("registry: summing spend of %s: %w", m.Name, err)
	}
	return usd(nusd(m.BudgetUSD) - n), true, nil
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
	Requests         int       `json:"requests"`
	PromptTokens     int       `json:"prompt_tokens"`
	CompletionTokens int       `json:"completion_tokens"`
	// Recent holds the latest entries of the period, newest first.
	Recent []Usage `json:"recent"`
}

// Summarize returns member's usage in the current period with up to recent
// latest entries. Errors: ErrNotFound for an unknown member.
func (r *Registry) Summarize(ctx context.Context, member string, recent int) (Summary, error) {
	m, err := r.Member(ctx, member)
	if err != nil {
		return Summary{}, err
	}
	start, end := m.PeriodAt(r.now())
	s := Summary{Member: m.Name, Period: m.Period, PeriodStart: start, PeriodEnd: end, BudgetUSD: m.BudgetUSD, Recent: []Usage{}}
	var spent int64
	err = r.db.QueryRowContext(ctx, `SELECT COUNT(*), COALESCE(SUM(prompt_tokens), 0), COALESCE(SUM(completion_tokens), 0), COALESCE(SUM(cost_nusd), 0)
		FROM usage WHERE member = ? AND ts >= ?`, m.Name, ms(start)).Scan(&s.Requests, &s.PromptTokens, &s.CompletionTokens, &spent)
	if err != nil {
		return Summary{}, fmt.Errorf("registry: summing usage of %s: %w", m.Name, err)
	}
	s.SpentUSD = usd(spent)
	if m.BudgetUSD > 0 {
		left := usd(nusd(m.BudgetUSD) - spent)
		s.RemainingUSD = &left
	}
	rows, err := r.db.QueryContext(ctx, `SELECT decision_id, model, target, tier, prompt_tokens, completion_tokens, estimated, cost_nusd, ts
		FROM usage WHERE member = ? AND ts >= ? ORDER BY ts DESC, id DESC LIMIT ?`, m.Name, ms(start), recent)
	if err != nil {
		return Summary{}, fmt.Errorf("registry: reading usage of %s: %w", m.Name, err)
	}
	defer rows.Close()
	for rows.Next() {
		u := Usage{Member: m.Name}
		var cost, ts int64
		if err := rows.Scan(&u.DecisionID, &u.Model, &u.Target, &u.Tier, &u.PromptTokens, &u.CompletionTokens, &u.Estimated, &cost, &ts); err != nil {
			return Summary{}, fmt.Errorf("registry: reading usage of %s: %w", m.Name, err)
		}
		u.CostUSD, u.Time = usd(cost), fromMS(ts)
		s.Recent = append(s.Recent, u)
	}
	return s, rows.Err()
}
