package registry

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"
)

// CuratedSet is a named set of training and held-out pairs of one domain.
type CuratedSet struct {
	Name    string
	Domain  string
	Source  string // "traces" or "import"
	Created time.Time
	Items   []CuratedItem
}

// Splits of a curated item.
const (
	SplitTrain   = "train"
	SplitHeldOut = "heldout"
)

// CuratedItem is one pair: the prompt (a JSON array of chat messages) and
// the answer to learn, from a trace (TraceID, Member) or imported.
type CuratedItem struct {
	TraceID  int64
	Member   string
	Split    string // SplitTrain or SplitHeldOut
	Teacher  string // the tier whose answer is the target ("" for imports)
	Messages string
	Answer   string
}

// PutCuratedSet stores s, replacing a set of the same name, in one
// transaction. Errors: ErrInvalid for an empty name or an item with
// another split; the store's.
func (r *Registry) PutCuratedSet(ctx context.Context, s CuratedSet) error {
	if s.Name == "" {
		return fmt.Errorf("registry: curated set without a name: %w", ErrInvalid)
	}
	err := r.txq(ctx, func(q q) error {
		if _, err := q.exec(`DELETE FROM curated_items WHERE set_name = ?`, s.Name); err != nil {
			return err
		}
		if _, err := q.exec(`DELETE FROM curated_sets WHERE name = ?`, s.Name); err != nil {
			return err
		}
		if _, err := q.exec(`INSERT INTO curated_sets (name, domain, source, created) VALUES (?, ?, ?, ?)`, s.Name, s.Domain, s.Source, ms(r.now())); err != nil {
			return err
		}
		for i, it := range s.Items {
			if it.Split != SplitTrain && it.Split != SplitHeldOut {
				return fmt.Errorf("item %d: split %q: %w", i, it.Split, ErrInvalid)
			}
			if _, err := q.exec(`INSERT INTO curated_items (set_name, seq, trace_id, member, split, teacher, messages, answer) VALUES (?, ?, ?, ?, ?, ?, ?, ?)`,
				s.Name, i, it.TraceID, it.Member, it.Split, it.Teacher, it.Messages, it.Answer); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("registry: storing curated set %s: %w", s.Name, err)
	}
	return nil
}

// CuratedSet returns the set name with its items in order. Errors:
// ErrNotFound, the store's.
func (r *Registry) CuratedSet(ctx context.Context, name string) (CuratedSet, error) {
	s := CuratedSet{Name: name}
	var created int64
	err := r.db.QueryRowContext(ctx, `SELECT domain, source, created FROM curated_sets WHERE name = ?`, name).Scan(&s.Domain, &s.Source, &created)
	if errors.Is(err, sql.ErrNoRows) {
		return CuratedSet{}, fmt.Errorf("registry: curated set %q: %w", name, ErrNotFound)
	}
	if err != nil {
		return CuratedSet{}, fmt.Errorf("registry: curated set %q: %w", name, err)
	}
	s.Created = fromMS(created)
	rows, err := r.db.QueryContext(ctx, `SELECT trace_id, member, split, teacher, messages, answer FROM curated_items WHERE set_name = ? ORDER BY seq`, name)
	if err != nil {
		return CuratedSet{}, err
	}
	defer rows.Close()
	for rows.Next() {
		var it CuratedItem
		if err := rows.Scan(&it.TraceID, &it.Member, &it.Split, &it.Teacher, &it.Messages, &it.Answer); err != nil {
			return CuratedSet{}, err
		}
		s.Items = append(s.Items, it)
	}
	return s, rows.Err()
}

// AdapterVersion is one adapter file known to the registry, by content
// hash, pinned to the base it was made for.
type AdapterVersion struct {
	Version      string    `json:"version"` // hex SHA-256 of the GGUF file
	Name         string    `json:"name"`    // the adapter name it serves under (its domain)
	BaseChecksum string    `json:"base_checksum"`
	BaseQuant    string    `json:"base_quant"`
	Path         string    `json:"path"`
	Set          string    `json:"set"`       // the curated set it was trained on
	Source       string    `json:"source"`    // trained | external | import
	Scores       string    `json:"scores"`    // the evaluation, JSON ("" before)
	Verdict      string    `json:"verdict"`   // promoted | refused | ""
	Forgotten    int       `json:"forgotten"` // training traces since deleted with their member
	Created      time.Time `json:"created"`
}

// AdapterEvent is one entry of an adapter name's history.
type AdapterEvent struct {
	ID      int64     `json:"id"`
	Name    string    `json:"name"`
	Version string    `json:"version"`
	Action  string    `json:"action"` // promote | rollback | refuse
	Reason  string    `json:"reason"`
	Created time.Time `json:"created"`
}

// TrainedOn is one trace an adapter version was trained on.
type TrainedOn struct {
	TraceID int64
	Member  string
}

// PutAdapterVersion records v and the traces it was trained on in one
// transaction (a version already recorded is updated). Errors: ErrInvalid
// for a missing version, name or base checksum; the store's.
func (r *Registry) PutAdapterVersion(ctx context.Context, v AdapterVersion, trainedOn []TrainedOn) error {
	if v.Version == "" || v.Name == "" {
		return fmt.Errorf("registry: adapter version needs a version and a name: %w", ErrInvalid)
	}
	err := r.txq(ctx, func(q q) error {
		if _, err := q.exec(`INSERT INTO adapter_versions (version, name, base_checksum, base_quant, path, set_name, source, scores, verdict, created)
			VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
			ON CONFLICT (version) DO UPDATE SET name = excluded.name, path = excluded.path, scores = excluded.scores, verdict = excluded.verdict`,
			v.Version, v.Name, v.BaseChecksum, v.BaseQuant, v.Path, v.Set, v.Source, v.Scores, v.Verdict, ms(r.now())); err != nil {
			return err
		}
		for _, t := range trainedOn {
			if _, err := q.exec(`INSERT INTO adapter_traces (version, trace_id, member) VALUES (?, ?, ?) ON CONFLICT (version, trace_id) DO NOTHING`,
				v.Version, t.TraceID, t.Member); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("registry: storing adapter version %.12s: %w", v.Version, err)
	}
	return nil
}

const versionCols = `version, name, base_checksum, base_quant, path, set_name, source, scores, verdict, forgotten, created`

func scanVersion(s scanner) (AdapterVersion, error) {
	var v AdapterVersion
	var created int64
	err := s.Scan(&v.Version, &v.Name, &v.BaseChecksum, &v.BaseQuant, &v.Path, &v.Set, &v.Source, &v.Scores, &v.Verdict, &v.Forgotten, &created)
	v.Created = fromMS(created)
	return v, err
}

// AdapterVersion returns the version whose hash starts with prefix (at
// least 4 hex digits). Errors: ErrNotFound, ErrInvalid for a short or
// ambiguous prefix.
func (r *Registry) AdapterVersion(ctx context.Context, prefix string) (AdapterVersion, error) {
	if len(prefix) < 4 || strings.Trim(prefix, "0123456789abcdef") != "" {
		return AdapterVersion{}, fmt.Errorf("registry: version prefix %q: want at least 4 lower-case hex digits: %w", prefix, ErrInvalid)
	}
	rows, err := r.db.QueryContext(ctx, `SELECT `+versionCols+` FROM adapter_versions WHERE version LIKE ? ORDER BY version LIMIT 2`, prefix+"%")
	if err != nil {
		return AdapterVersion{}, err
	}
	defer rows.Close()
	var out []AdapterVersion
	for rows.Next() {
		v, err := scanVersion(rows)
		if err != nil {
			return AdapterVersion{}, err
		}
		out = append(out, v)
	}
	switch len(out) {
	case 0:
		return AdapterVersion{}, fmt.Errorf("registry: adapter version %s: %w", prefix, ErrNotFound)
	case 1:
		return out[0], rows.Err()
	}
	return AdapterVersion{}, fmt.Errorf("registry: adapter version prefix %s is ambiguous: %w", prefix, ErrInvalid)
}

// AdapterVersions returns the versions of name ("" for every name),
// newest first.
func (r *Registry) AdapterVersions(ctx context.Context, name string) ([]AdapterVersion, error) {
	rows, err := r.db.QueryContext(ctx, `SELECT `+versionCols+` FROM adapter_versions WHERE ? = '' OR name = ? ORDER BY created DESC, version`, name, name)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []AdapterVersion
	for rows.Next() {
		v, err := scanVersion(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	return out, rows.Err()
}

// TrainedOnTraces returns the traces version was trained on, by id.
func (r *Registry) TrainedOnTraces(ctx context.Context, version string) ([]TrainedOn, error) {
	rows, err := r.db.QueryContext(ctx, `SELECT trace_id, member FROM adapter_traces WHERE version = ? ORDER BY trace_id`, version)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []TrainedOn
	for rows.Next() {
		var t TrainedOn
		if err := rows.Scan(&t.TraceID, &t.Member); err != nil {
			return nil, err
		}
		out = append(out, t)
	}
	return out, rows.Err()
}

// SetAlias points name at version (a promotion or a rollback) and
// records the event, in one transaction. Errors: ErrNotFound for an
// unknown version, the store's.
func (r *Registry) SetAlias(ctx context.Context, name, version, action, reason string) error {
	err := r.txq(ctx, func(q q) error {
		var n int
		if err := q.row(`SELECT COUNT(*) FROM adapter_versions WHERE version = ?`, version).Scan(&n); err != nil {
			return err
		}
		if n == 0 {
			return fmt.Errorf("adapter version %.12s: %w", version, ErrNotFound)
		}
		if _, err := q.exec(`INSERT INTO adapter_aliases (name, version, updated) VALUES (?, ?, ?)
			ON CONFLICT (name) DO UPDATE SET version = excluded.version, updated = excluded.updated`, name, version, ms(r.now())); err != nil {
			return err
		}
		_, err := q.exec(`INSERT INTO adapter_events (name, version, action, reason, created) VALUES (?, ?, ?, ?, ?)`, name, version, action, reason, ms(r.now()))
		return err
	})
	if err != nil {
		return fmt.Errorf("registry: alias %s: %w", name, err)
	}
	return nil
}

// AddAdapterEvent records an event without moving the alias (a refused
// candidate, an evaluation).
func (r *Registry) AddAdapterEvent(ctx context.Context, e AdapterEvent) error {
	_, err := r.exec(ctx, `INSERT INTO adapter_events (name, version, action, reason, created) VALUES (?, ?, ?, ?, ?)`,
		e.Name, e.Version, e.Action, e.Reason, ms(r.now()))
	if err != nil {
		return fmt.Errorf("registry: adapter event: %w", err)
	}
	return nil
}

// Aliases returns every alias name → version.
func (r *Registry) Aliases(ctx context.Context) (map[string]string, error) {
	rows, err := r.db.QueryContext(ctx, `SELECT name, version FROM adapter_aliases ORDER BY name`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[string]string{}
	for rows.Next() {
		var n, v string
		if err := rows.Scan(&n, &v); err != nil {
			return nil, err
		}
		out[n] = v
	}
	return out, rows.Err()
}

// AdapterEvents returns the history of name ("" for every name), oldest first.
func (r *Registry) AdapterEvents(ctx context.Context, name string) ([]AdapterEvent, error) {
	rows, err := r.db.QueryContext(ctx, `SELECT id, name, version, action, reason, created FROM adapter_events WHERE ? = '' OR name = ? ORDER BY id`, name, name)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []AdapterEvent
	for rows.Next() {
		var e AdapterEvent
		var created int64
		if err := rows.Scan(&e.ID, &e.Name, &e.Version, &e.Action, &e.Reason, &created); err != nil {
			return nil, err
		}
		e.Created = fromMS(created)
		out = append(out, e)
	}
	return out, rows.Err()
}
