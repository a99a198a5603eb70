// Package sqlite is the one way Molly opens a SQLite file (modernc.org/sqlite,
// pure Go): the registry, and every tool plugin's own file, through it.
//
// One set of pragmas for all of them (https://www.sqlite.org/pragma.html):
//
//   - journal_mode=WAL: readers never block the writer (https://www.sqlite.org/wal.html);
//   - synchronous=NORMAL (default) or FULL: in WAL mode NORMAL makes a committed
//     transaction survive a crash of the process (kill -9), since the WAL write
//     reaches the operating system before COMMIT returns; only a power loss or
//     kernel crash can roll back the last transactions. FULL also fsyncs each
//     commit, for machines where that matters;
//   - busy_timeout=5000 ms: another process holding the write lock is waited
//     for, not an error;
//   - foreign_keys=ON;
//   - temp_store=MEMORY: statement journals (which a multi-row insert or an
//     upsert keeps, to undo just that statement) and temporary tables stay in
//     memory instead of a temporary file, which cost a write(2) per page on
//     every batched commit (https://www.sqlite.org/tempfiles.html);
//   - wal_autocheckpoint: SQLite's 1000 pages unless Options.AutoCheckpoint
//     says otherwise. The commit that crosses it copies the WAL into the
//     file and syncs both before it returns (https://www.sqlite.org/wal.html#ckpt):
//     a handle on a request path takes a larger WAL (bounded by it) for
//     fewer such commits. Durability does not depend on it: a commit is in
//     the WAL before COMMIT returns either way;
//   - every transaction begins IMMEDIATE (the driver's _txlock): it takes the
//     write lock when it starts, so a read-then-write transaction of one
//     process can never be invalidated by another's commit (which in WAL mode
//     is an immediate SQLITE_BUSY that no busy timeout retries). Two
//     processes sharing a file therefore serialise their transactions
//     exactly, which is what conditional updates (budgets, rate windows) need.
//
// The file is created with mode 0600 (the WAL and shared-memory files inherit
// it) in a folder created with 0700. Schemas are versioned migrations recorded
// in the table schema_migrations and applied in order at open, each in its own
// transaction; a file newer than the code (a version it does not know) is
// refused. Migrations are written in the SQL subset PostgreSQL shares (no
// SQLite-only functions), so that a pgx backend can mirror them one for one.
package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	_ "modernc.org/sqlite" // the "sqlite" database/sql driver
)

// ErrInvalid reports bad options or migrations; the message names the field.
var ErrInvalid = errors.New("invalid")

// Options tune Open.
type Options struct {
	// Synchronous is SQLite's synchronous pragma: "NORMAL" (default; durable
	// across process crashes in WAL mode) or "FULL" (also across power loss).
	// Case does not matter.
	Synchronous string
	// BusyTimeout is how long a statement waits for another connection's
	// lock before failing with SQLITE_BUSY; default 5 s.
	BusyTimeout time.Duration
	// MaxOpenConns bounds the pool; default 1: the process's writes
	// serialise anyway, and one connection queues them in Go (cheap) rather
	// than in SQLite's busy handler (sleeps).
	MaxOpenConns int
	// ReadOnly opens an existing file for reading only (no folder, no
	// migrations; mode=ro).
	ReadOnly bool
	// AutoCheckpoint is the WAL size in pages (4 KiB each) past which a
	// commit checkpoints (SQLite's wal_autocheckpoint); 0 is SQLite's
	// default, 1000. A checkpoint syncs the WAL and the file, which on a
	// virtual disk takes milliseconds, inside the commit that triggers it:
	// every AutoCheckpoint pages of commits, one commit pays that. The WAL
	// file grows to about this size and stays there. Negative is ErrInvalid.
	AutoCheckpoint int
}

// Migration is one step of a schema: Version (1, 2, … without gaps, in
// order) and a Name for schema_migrations, then SQL (statements separated
// by ";") and, when set, Up, both in one transaction. Up is for steps SQL
// alone cannot express portably (e.g. recomputing a counter with Go date
// arithmetic); it must use only the transaction it is given.
type Migration struct {
	Version int
	Name    string
	SQL     string
	Up      func(ctx context.Context, tx *sql.Tx) error
}

// migrationsTable records the applied versions.
const migrationsTable = `CREATE TABLE IF NOT EXISTS schema_migrations (
	version INTEGER PRIMARY KEY,
	name    TEXT NOT NULL,
	applied BIGINT NOT NULL -- unix ms
)`

// Open opens (creating if needed, with its folder) the SQLite file at path
// and applies the migrations it has not applied yet, in order. Errors name
// the path: the folder or file cannot be made, a bad option (ErrInvalid),
// migrations out of order (ErrInvalid), a file migrated by newer code (a
// version not in migrations), or a failing migration (nothing of it is kept).
func Open(path string, opts Options, migrations ...Migration) (*sql.DB, error) {
	if path == "" {
		return nil, fmt.Errorf("sqlite: empty path: %w", ErrInvalid)
	}
	sync := strings.ToUpper(opts.Synchronous)
	switch sync {
	case "":
		sync = "NORMAL"
	case "NORMAL", "FULL":
	default:
		return nil, fmt.Errorf("sqlite: synchronous %q must be NORMAL or FULL: %w", opts.Synchronous, ErrInvalid)
	}
	for i, m := range migrations {
		if m.Version != i+1 {
			return nil, fmt.Errorf("sqlite: migration %d (%s) must have version %d: %w", m.Version, m.Name, i+1, ErrInvalid)
		}
	}
	if opts.AutoCheckpoint < 0 {
		return nil, fmt.Errorf("sqlite: auto-checkpoint %d pages must not be negative: %w", opts.AutoCheckpoint, ErrInvalid)
	}
	busy := opts.BusyTimeout
	if busy <= 0 {
		busy = 5 * time.Second
	}
	q := url.Values{}
	q.Set("_txlock", "immediate")
	for _, p := range []string{"journal_mode(WAL)", "synchronous(" + sync + ")", fmt.Sprintf("busy_timeout(%d)", busy.Milliseconds()), "foreign_keys(1)", "temp_store(MEMORY)"} {
		q.Add("_pragma", p)
	}
	if opts.AutoCheckpoint > 0 {
		q.Add("_pragma", fmt.Sprintf("wal_autocheckpoint(%d)", opts.AutoCheckpoint))
	}
	if opts.ReadOnly {
		q.Set("mode", "ro")
		if _, err := os.Stat(path); err != nil {
			return nil, fmt.Errorf("sqlite: %w", err)
		}
	} else if err := create(path); err != nil {
		return nil, fmt.Errorf("sqlite: %w", err)
	}
	db, err := sql.Open("sqlite", "file:"+path+"?"+q.Encode())
	if err != nil {
		return nil, fmt.Errorf("sqlite: opening %s: %w", path, err)
	}
	conns := opts.MaxOpenConns
	if conns <= 0 {
		conns = 1
	}
	db.SetMaxOpenConns(conns)
	db.SetMaxIdleConns(conns)
	if err := db.Ping(); err != nil {
		db.Close()
		return nil, fmt.Errorf("sqlite: opening %s: %w", path, err)
	}
	if opts.ReadOnly {
		return db, nil
	}
	if err := migrate(context.Background(), db, migrations); err != nil {
		db.Close()
		return nil, fmt.Errorf("sqlite: %s: %w", path, err)
	}
	return db, nil
}

// create makes the folder (0700) and the file (0600) before SQLite opens it,
// so the file is never readable by others, not even for a moment; SQLite
// gives its -wal and -shm files the database file's permissions.
func create(path string) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	// A file made by an older Molly (or by hand) may be wider open.
	return os.Chmod(path, 0o600)
}

// Applied returns the versions recorded in db's schema_migrations, in order.
func Applied(ctx context.Context, db *sql.DB) ([]int, error) {
	rows, err := db.QueryContext(ctx, `SELECT version FROM schema_migrations ORDER BY version`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []int
	for rows.Next() {
		var v int
		if err := rows.Scan(&v); err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	return out, rows.Err()
}

func migrate(ctx context.Context, db *sql.DB, migrations []Migration) error {
	if _, err := db.ExecContext(ctx, migrationsTable); err != nil {
		return fmt.Errorf("creating schema_migrations: %w", err)
	}
	for _, m := range migrations {
		if err := apply(ctx, db, m); err != nil {
			return err
		}
	}
	applied, err := Applied(ctx, db)
	if err != nil {
		return fmt.Errorf("reading schema_migrations: %w", err)
	}
	if n := len(applied); n > 0 && applied[n-1] > len(migrations) {
		return fmt.Errorf("schema version %d is newer than this Molly knows (%d); use a newer Molly", applied[n-1], len(migrations))
	}
	return nil
}

// apply runs m unless it is recorded, in one transaction: BEGIN IMMEDIATE
// holds the write lock, so two processes opening a new file at once apply
// each migration once (the second sees it recorded).
func apply(ctx context.Context, db *sql.DB, m Migration) error {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("migration %d (%s): %w", m.Version, m.Name, err)
	}
	defer tx.Rollback()
	var n int
	if err := tx.QueryRowContext(ctx, `SELECT COUNT(*) FROM schema_migrations WHERE version = ?`, m.Version).Scan(&n); err != nil {
		return fmt.Errorf("migration %d (%s): %w", m.Version, m.Name, err)
	}
	if n > 0 {
		return nil
	}
	for _, stmt := range statements(m.SQL) {
		if _, err := tx.ExecContext(ctx, stmt); err != nil {
			return fmt.Errorf("migration %d (%s): %w", m.Version, m.Name, err)
		}
	}
	if m.Up != nil {
		if err := m.Up(ctx, tx); err != nil {
			return fmt.Errorf("migration %d (%s): %w", m.Version, m.Name, err)
		}
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO schema_migrations (version, name, applied) VALUES (?, ?, ?)`,
		m.Version, m.Name, time.Now().UnixMilli()); err != nil {
		return fmt.Errorf("migration %d (%s): %w", m.Version, m.Name, err)
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("migration %d (%s): %w", m.Version, m.Name, err)
	}
	return nil
}

// statements splits a migration's SQL at the ";" that end statements, outside
// quotes and "--" comments, dropping empty ones.
func statements(src string) []string {
	var out []string
	var b strings.Builder
	inQuote, inComment := false, false
	for i := 0; i < len(src); i++ {
		c := src[i]
		switch {
		case inComment:
			if c == '\n' {
				inComment = false
				b.WriteByte(c)
			}
			continue
		case inQuote:
			if c == '\'' {
				inQuote = false
			}
		case c == '\'':
			inQuote = true
		case c == '-' && i+1 < len(src) && src[i+1] == '-':
			inComment = true
			continue
		case c == ';':
			if s := strings.TrimSpace(b.String()); s != "" {
				out = append(out, s)
			}
			b.Reset()
			continue
		}
		b.WriteByte(c)
	}
	if s := strings.TrimSpace(b.String()); s != "" {
		out = append(out, s)
	}
	return slices.Clip(out)
}
