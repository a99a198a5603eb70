package registry

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"
)

// Trace is one consented request as the specialisation loop keeps it
// (learning/traces captures it): what the answering tier saw and wrote, the
// route, and the quality signals. Request and Answer hold user text: they
// are stored only with consent and never logged.
type Trace struct {
	ID          int64
	DecisionID  string
	Member      string
	Category    string // the capability estimator's task category
	Model       string // the client's model name
	Label       string // how the request ended (routed, fallback, escalated, ...)
	Strategy    string
	Route       string // JSON of the candidates and attempts, no text
	Tier        string // the answering tier
	Target      string
	ServedModel string // the upstream model; a T0 adapter is "<base>:<adapter>"
	Request     string // the chat body as the answering tier saw it (JSON)
	Answer      string // the answer's text as that tier wrote it
	Escalations int    // answers escalated away from before this one (cascade)
	Score       float64
	ScoreKind   string
	Feedback    float64 // explicit score in [0,1]; -1: none
	Edit        string  // the client's corrected answer; "": none
	Created     time.Time
}

// Consent scopes.
const (
	ConsentMember = "member"
	ConsentKey    = "key"
)

// TraceConsent is a standing consent (or refusal) to capture traces.
type TraceConsent struct {
	Scope         string // ConsentMember or ConsentKey
	Name          string // the member, or the key prefix
	Trace         bool
	RetentionDays int // member scope: days a trace is kept (0: the loop's default)
	Updated       time.Time
}

// PutTraces stores traces in one transaction, committed (durable: see
// the package comment) before it returns their ids in order; a trace whose
// decision id is stored already keeps its row and gets id 0. Errors: the
// store's.
func (r *Registry) PutTraces(ctx context.Context, ts []Trace) ([]int64, error) {
	ids := make([]int64, len(ts))
	err := r.txq(ctx, func(q q) error {
		for i, t := range ts {
			if t.Created.IsZero() {
				t.Created = r.now()
			}
			err := q.row(`INSERT INTO traces (decision_id, member, category, model, label, strategy, route, tier, target, served_model,
				request, answer, escalations, score, score_kind, feedback, edit, created)
				VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
				ON CONFLICT (decision_id) DO NOTHING RETURNING id`,
				t.DecisionID, t.Member, t.Category, t.Model, t.Label, t.Strategy, t.Route, t.Tier, t.Target, t.ServedModel,
				t.Request, t.Answer, t.Escalations, t.Score, t.ScoreKind, t.Feedback, t.Edit, ms(t.Created)).Scan(&ids[i])
			if errors.Is(err, sql.ErrNoRows) {
				continue
			}
			if err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("registry: storing traces: %w", err)
	}
	return ids, nil
}

// TraceFeedback records explicit feedback on the trace of decisionID:
// score in [0,1] when score ≥ 0, and the client's corrected answer when
// edit is not empty. It reports whether a trace was there. Errors:
// ErrInvalid for a score above 1, the store's.
func (r *Registry) TraceFeedback(ctx context.Context, decisionID string, score float64, edit string) (bool, error) {
	if score > 1 {
		return false, fmt.Errorf("registry: feedback score %v above 1: %w", score, ErrInvalid)
	}
	res, err := r.exec(ctx, `UPDATE traces SET feedback = CASE WHEN ? >= 0 THEN ? ELSE feedback END,
		edit = CASE WHEN ? <> '' THEN ? ELSE edit END WHERE decision_id = ?`, score, score, edit, edit, decisionID)
	if err != nil {
		return false, fmt.Errorf("registry: trace feedback: %w", err)
	}
	n, _ := res.RowsAffected()
	return n > 0, nil
}

// TraceQuery selects traces; zero fields select everything.
type TraceQuery struct {
	Member   string
	Category string
	AfterID  int64 // ids greater than this
	Limit    int   // at most this many (0: no limit)
}

const traceCols = `id, decision_id, member, category, model, label, strategy, route, tier, target, served_model,
	request, answer, escalations, score, score_kind, feedback, edit, created`

// Traces returns the traces q selects, by id.
func (r *Registry) Traces(ctx context.Context, q TraceQuery) ([]Trace, error) {
	var where []string
	var args []any
	if q.Member != "" {
		where, args = append(where, "member = ?"), append(args, q.Member)
	}
	if q.Category != "" {
		where, args = append(where, "category = ?"), append(args, q.Category)
	}
	if q.AfterID > 0 {
		where, args = append(where, "id > ?"), append(args, q.AfterID)
	}
	query := `SELECT ` + traceCols + ` FROM traces`
	if len(where) > 0 {
		query += " WHERE " + strings.Join(where, " AND ")
	}
	query += " ORDER BY id"
	if q.Limit > 0 {
		query += fmt.Sprintf(" LIMIT %d", q.Limit)
	}
	rows, err := r.db.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, fmt.Errorf("registry: traces: %w", err)
	}
	defer rows.Close()
	var out []Trace
	for rows.Next() {
		var t Trace
		var created int64
		if err := rows.Scan(&t.ID, &t.DecisionID, &t.Member, &t.Category, &t.Model, &t.Label, &t.Strategy, &t.Route, &t.Tier, &t.Target,
			&t.ServedModel, &t.Request, &t.Answer, &t.Escalations, &t.Score, &t.ScoreKind, &t.Feedback, &t.Edit, &created); err != nil {
			return nil, fmt.Errorf("registry: traces: %w", err)
		}
		t.Created = fromMS(created)
		out = append(out, t)
	}
	return out, rows.Err()
}

// TraceCount is the number of traces of one category, and the highest id.
type TraceCount struct {
	Category string
	N        int
	MaxID    int64
}

// TraceCounts counts the traces with ids above afterID per category.
func (r *Registry) TraceCounts(ctx context.Context, afterID int64) ([]TraceCount, error) {
	rows, err := r.db.QueryContext(ctx, `SELECT category, COUNT(*), MAX(id) FROM traces WHERE id > ? GROUP BY category ORDER BY category`, afterID)
	if err != nil {
		return nil, fmt.Errorf("registry: trace counts: %w", err)
	}
	defer rows.Close()
	var out []TraceCount
	for rows.Next() {
		var c TraceCount
		if err := rows.Scan(&c.Category, &c.N, &c.MaxID); err != nil {
			return nil, err
		}
		out = append(out, c)
	}
	return out, rows.Err()
}

// Forgotten is what DeleteMemberTraces removed.
type Forgotten struct {
	Traces       int      `json:"traces"`
	CuratedItems int      `json:"curated_items"`
	Adapters     []string `json:"adapters"` // versions trained on some of them (their forgotten count grew)
}

// DeleteMemberTraces removes everything the specialisation loop holds of
// member — its traces, its pairs in curated sets, its consent rows and
// the record of which adapter versions were trained on its traces (those
// versions count them in forgotten) — in one transaction: a later
// curation or training cannot see any of it. Errors: the store's.
func (r *Registry) DeleteMemberTraces(ctx context.Context, member string) (Forgotten, error) {
	var f Forgotten
	err := r.txq(ctx, func(q q) error {
		f = Forgotten{}
		rows, err := q.rows(`SELECT version, COUNT(*) FROM adapter_traces WHERE member = ? GROUP BY version ORDER BY version`, member)
		if err != nil {
			return err
		}
		counts := map[string]int{}
		for rows.Next() {
			var v string
			var n int
			if err := rows.Scan(&v, &n); err != nil {
				rows.Close()
				return err
			}
			counts[v] = n
			f.Adapters = append(f.Adapters, v)
		}
		if err := rows.Close(); err != nil {
			return err
		}
		for v, n := range counts {
			if _, err := q.exec(`UPDATE adapter_versions SET forgotten = forgotten + ? WHERE version = ?`, n, v); err != nil {
				return err
			}
		}
		if _, err := q.exec(`DELETE FROM adapter_traces WHERE member = ?`, member); err != nil {
			return err
		}
		res, err := q.exec(`DELETE FROM curated_items WHERE member = ?`, member)
		if err != nil {
			return err
		}
		n, _ := res.RowsAffected()
		f.CuratedItems = int(n)
		if res, err = q.exec(`DELETE FROM traces WHERE member = ?`, member); err != nil {
			return err
		}
		n, _ = res.RowsAffected()
		f.Traces = int(n)
		_, err = q.exec(`DELETE FROM trace_consent WHERE scope = ? AND name = ?`, ConsentMember, member)
		return err
	})
	if err != nil {
		return Forgotten{}, fmt.Errorf("registry: deleting the traces of %s: %w", member, err)
	}
	return f, nil
}

// PruneTraces deletes traces older than their member's retention (its
// member consent's retention_days, else defaultDays; ≤ 0 keeps them) as
// of now, and their curated pairs. It returns how many traces went.
func (r *Registry) PruneTraces(ctx context.Context, now time.Time, defaultDays int) (int, error) {
	var n int64
	err := r.txq(ctx, func(q q) error {
		cut := `(SELECT t.id FROM traces t LEFT JOIN trace_consent c ON c.scope = 'member' AND c.name = t.member
			WHERE (CASE WHEN c.retention_days > 0 THEN c.retention_days ELSE ? END) > 0
			AND t.created < ? - (CASE WHEN c.retention_days > 0 THEN c.retention_days ELSE ? END) * 86400000)`
		if _, err := q.exec(`DELETE FROM curated_items WHERE trace_id IN `+cut, defaultDays, ms(now), defaultDays); err != nil {
			return err
		}
		res, err := q.exec(`DELETE FROM traces WHERE id IN `+cut, defaultDays, ms(now), defaultDays)
		if err != nil {
			return err
		}
		n, _ = res.RowsAffected()
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("registry: pruning traces: %w", err)
	}
	return int(n), nil
}

// SetTraceConsent stores a standing consent. A key's consent is stored
// under its prefix (DisplayPrefix), the name requests are matched by, when
// the name is the whole key: keys are never stored in the clear. Errors:
// ErrInvalid for an unknown scope, an empty name or a negative retention;
// the store's.
func (r *Registry) SetTraceConsent(ctx context.Context, c TraceConsent) error {
	if c.Scope != ConsentMember {
		c.Name = DisplayPrefix(c.Name) // before any error names it
	}
	if (c.Scope != ConsentMember && c.Scope != ConsentKey) || c.Name == "" || c.RetentionDays < 0 {
		return fmt.Errorf("registry: consent scope %q name %q retention %d: want member|key, a name, days ≥ 0: %w", c.Scope, c.Name, c.RetentionDays, ErrInvalid)
	}
	on := 0
	if c.Trace {
		on = 1
	}
	_, err := r.exec(ctx, `INSERT INTO trace_consent (scope, name, trace, retention_days, updated) VALUES (?, ?, ?, ?, ?)
		ON CONFLICT (scope, name) DO UPDATE SET trace = excluded.trace, retention_days = excluded.retention_days, updated = excluded.updated`,
		c.Scope, c.Name, on, c.RetentionDays, ms(r.now()))
	if err != nil {
		return fmt.Errorf("registry: consent: %w", err)
	}
	return nil
}

// TraceConsents returns every standing consent, by scope and name.
func (r *Registry) TraceConsents(ctx context.Context) ([]TraceConsent, error) {
	rows, err := r.db.QueryContext(ctx, `SELECT scope, name, trace, retention_days, updated FROM trace_consent ORDER BY scope, name`)
	if err != nil {
		return nil, fmt.Errorf("registry: consents: %w", err)
	}
	defer rows.Close()
	var out []TraceConsent
	for rows.Next() {
		var c TraceConsent
		var on int
		var up int64
		if err := rows.Scan(&c.Scope, &c.Name, &on, &c.RetentionDays, &up); err != nil {
			return nil, err
		}
		c.Trace, c.Updated = on == 1, fromMS(up)
		out = append(out, c)
	}
	return out, rows.Err()
}

// Meta returns the value stored under key in the registry's meta table
// ("" and false when none).
func (r *Registry) Meta(ctx context.Context, key string) (string, bool, error) {
	var v string
	err := r.db.QueryRowContext(ctx, `SELECT value FROM meta WHERE key = ?`, key).Scan(&v)
	if errors.Is(err, sql.ErrNoRows) {
		return "", false, nil
	}
	if err != nil {
		return "", false, fmt.Errorf("registry: meta %s: %w", key, err)
	}
	return v, true, nil
}

// SetMeta stores value under key in the meta table.
func (r *Registry) SetMeta(ctx context.Context, key, value string) error {
	_, err := r.exec(ctx, `INSERT INTO meta (key, value) VALUES (?, ?) ON CONFLICT (key) DO UPDATE SET value = excluded.value`, key, value)
	if err != nil {
		return fmt.Errorf("registry: meta %s: %w", key, err)
	}
	return nil
}
