package registry

import (
	"database/sql"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"time"
)

// Prior is one learned routing prior as stored: an EWMA of answer quality
// per (target, model, category) (Kind "quality", Value in [0,1]) or of a
// target's latency (Kind "ttfb_s" or "total_s", Value in seconds, Model and
// Category empty). The router's PriorRecord has the same fields; the Caddy
// glue converts, so this package stays free of router types.
type Prior struct {
	Kind, Target, Model, Category string
	Value                         float64
	N                             int64 // observations folded in
	Updated                       time.Time
}

// PriorStore keeps priors in their own SQLite file (WAL), table priors.
// Save commits before it returns (see the package comment on durability).
// Safe for concurrent use.
type PriorStore struct {
	db   *sql.DB
	path string
}

const priorsSchema = `
CREATE TABLE IF NOT EXISTS priors (
	kind     TEXT NOT NULL,             -- quality | ttfb_s | total_s
	target   TEXT NOT NULL,
	model    TEXT NOT NULL DEFAULT '',  -- the upstream model; a T0 adapter is <base>:<adapter>
	category TEXT NOT NULL DEFAULT '',  -- the task category
	value    REAL NOT NULL,             -- quality in [0,1], or seconds
	n        INTEGER NOT NULL,          -- observations
	updated  INTEGER NOT NULL,          -- unix ms
	PRIMARY KEY (kind, target, model, category)
);
`

// OpenPriorStore opens (creating if needed) the priors file at path and its
// folder. Errors: the folder cannot be made, the file cannot be opened or
// its schema created.
func OpenPriorStore(path string) (*PriorStore, error) {
	if path == "" {
		return nil, fmt.Errorf("priors: empty path")
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("priors: %w", err)
	}
	q := url.Values{}
	for _, p := range []string{"journal_mode(WAL)", "synchronous(NORMAL)", "busy_timeout(5000)"} {
		q.Add("_pragma", p)
	}
	db, err := sql.Open("sqlite", "file:"+path+"?"+q.Encode())
	if err != nil {
		return nil, fmt.Errorf("priors: opening %s: %w", path, err)
	}
	db.SetMaxOpenConns(1)
	if _, err := db.Exec(priorsSchema); err != nil {
		db.Close()
		return nil, fmt.Errorf("priors: creating the schema in %s: %w", path, err)
	}
	return &PriorStore{db: db, path: path}, nil
}

// Path is the file the priors live in.
func (s *PriorStore) Path() string { return s.path }

// Load returns every stored prior, ordered by kind, target, model, category.
func (s *PriorStore) Load() ([]Prior, error) {
	rows, err := s.db.Query(`SELECT kind, target, model, category, value, n, updated FROM priors ORDER BY kind, target, model, category`)
	if err != nil {
		return nil, fmt.Errorf("priors: loading: %w", err)
	}
	defer rows.Close()
	var out []Prior
	for rows.Next() {
		var p Prior
		var ms int64
		if err := rows.Scan(&p.Kind, &p.Target, &p.Model, &p.Category, &p.Value, &p.N, &ms); err != nil {
			return nil, fmt.Errorf("priors: loading: %w", err)
		}
		p.Updated = time.UnixMilli(ms).UTC()
		out = append(out, p)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("priors: loading: %w", err)
	}
	return out, nil
}

// Save inserts or replaces priors in one transaction.
func (s *PriorStore) Save(priors []Prior) error {
	if len(priors) == 0 {
		return nil
	}
	tx, err := s.db.Begin()
	if err != nil {
		return fmt.Errorf("priors: saving: %w", err)
	}
	defer tx.Rollback()
	stmt, err := tx.Prepare(`INSERT INTO priors (kind, target, model, category, value, n, updated) VALUES (?, ?, ?, ?, ?, ?, ?)
		ON CONFLICT (kind, target, model, category) DO UPDATE SET value = excluded.value, n = excluded.n, updated = excluded.updated`)
	if err != nil {
		return fmt.Errorf("priors: saving: %w", err)
	}
	defer stmt.Close()
	for _, p := range priors {
		if _, err := stmt.Exec(p.Kind, p.Target, p.Model, p.Category, p.Value, p.N, p.Updated.UnixMilli()); err != nil {
			return fmt.Errorf("priors: saving %s %s/%s/%s: %w", p.Kind, p.Target, p.Model, p.Category, err)
		}
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("priors: saving: %w", err)
	}
	return nil
}

// Close closes the file.
func (s *PriorStore) Close() error { return s.db.Close() }
