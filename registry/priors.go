package registry

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/molly-gateway/molly/registry/sqlite"
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

// LoadPriors returns every stored prior, ordered by kind, target, model,
// category.
func (r *Registry) LoadPriors(ctx context.Context) ([]Prior, error) {
	out, err := loadPriors(ctx, r.db)
	if err != nil {
		return nil, fmt.Errorf("registry: loading priors: %w", err)
	}
	return out, nil
}

func loadPriors(ctx context.Context, db *sql.DB) ([]Prior, error) {
	rows, err := db.QueryContext(ctx, `SELECT kind, target, model, category, value, n, updated FROM priors ORDER BY kind, target, model, category`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []Prior
	for rows.Next() {
		var p Prior
		var at int64
		if err := rows.Scan(&p.Kind, &p.Target, &p.Model, &p.Category, &p.Value, &p.N, &at); err != nil {
			return nil, err
		}
		p.Updated = time.UnixMilli(at).UTC()
		out = append(out, p)
	}
	return out, rows.Err()
}

// SavePriors inserts or replaces priors in one transaction, committed
// before it returns.
func (r *Registry) SavePriors(ctx context.Context, priors []Prior) error {
	if len(priors) == 0 {
		return nil
	}
	if err := r.tx(ctx, func(tx *sql.Tx) error { return savePriors(ctx, tx, priors, true) }); err != nil {
		return fmt.Errorf("registry: saving priors: %w", err)
	}
	return nil
}

// savePriors upserts priors; replace false keeps the rows already there.
func savePriors(ctx context.Context, tx *sql.Tx, priors []Prior, replace bool) error {
	q := `INSERT INTO priors (kind, target, model, category, value, n, updated) VALUES (?, ?, ?, ?, ?, ?, ?)
		ON CONFLICT (kind, target, model, category) DO UPDATE SET value = excluded.value, n = excluded.n, updated = excluded.updated`
	if !replace {
		q = `INSERT INTO priors (kind, target, model, category, value, n, updated) VALUES (?, ?, ?, ?, ?, ?, ?)
		ON CONFLICT (kind, target, model, category) DO NOTHING`
	}
	stmt, err := tx.PrepareContext(ctx, q)
	if err != nil {
		return err
	}
	defer stmt.Close()
	for _, p := range priors {
		if _, err := stmt.ExecContext(ctx, p.Kind, p.Target, p.Model, p.Category, p.Value, p.N, p.Updated.UnixMilli()); err != nil {
			return fmt.Errorf("%s %s/%s/%s: %w", p.Kind, p.Target, p.Model, p.Category, err)
		}
	}
	return nil
}

// ImportPriors copies the priors of a legacy priors file (the priors_db of
// Molly before the priors joined the registry) into the registry, once per
// file: the import is remembered in the registry (table meta), and a prior
// the registry already holds is kept. The legacy file is read, never
// changed. A missing file imports nothing (0, nil) and is not remembered,
// so a file that appears later is still imported. Errors: the file cannot
// be read as a priors file.
func (r *Registry) ImportPriors(ctx context.Context, legacy string) (imported int, err error) {
	abs, err := filepath.Abs(legacy)
	if err != nil {
		return 0, fmt.Errorf("registry: importing priors from %s: %w", legacy, err)
	}
	if _, err := os.Stat(abs); errors.Is(err, os.ErrNotExist) {
		return 0, nil
	}
	key := "priors_imported:" + abs
	var done string
	switch err := r.db.QueryRowContext(ctx, `SELECT value FROM meta WHERE key = ?`, key).Scan(&done); {
	case err == nil:
		return 0, nil
	case !errors.Is(err, sql.ErrNoRows):
		return 0, fmt.Errorf("registry: importing priors from %s: %w", abs, err)
	}
	old, err := sqlite.Open(abs, sqlite.Options{ReadOnly: true})
	if err != nil {
		return 0, fmt.Errorf("registry: importing priors from %s: %w", abs, err)
	}
	defer old.Close()
	priors, err := loadPriors(ctx, old)
	if err != nil {
		return 0, fmt.Errorf("registry: importing priors from %s: %w", abs, err)
	}
	err = r.tx(ctx, func(tx *sql.Tx) error {
		if err := r.lock(ctx, tx, metaLock); err != nil {
			return err
		}
		// Checked again under the write lock: another process may have imported it meanwhile.
		switch err := tx.QueryRowContext(ctx, `SELECT value FROM meta WHERE key = ?`, key).Scan(&done); {
		case err == nil:
			priors = nil
			return nil
		case !errors.Is(err, sql.ErrNoRows):
			return err
		}
		if err := savePriors(ctx, tx, priors, false); err != nil {
			return err
		}
		_, err := tx.ExecContext(ctx, `INSERT INTO meta (key, value) VALUES (?, ?)`, key,
			fmt.Sprintf("%d priors at %s", len(priors), r.now().UTC().Format(time.RFC3339)))
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("registry: importing priors from %s: %w", abs, err)
	}
	return len(priors), nil
}
