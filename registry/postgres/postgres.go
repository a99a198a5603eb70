// Package postgres is the one way Molly opens a PostgreSQL registry
// (pgx through database/sql), the registry's backend for a fleet of
// gateways sharing one store (docs/architecture.md). It mirrors registry/sqlite:
// the same *sql.DB seam, the same versioned migrations recorded in
// schema_migrations, the same statements.
//
//   - Statements are written with SQLite's "?" placeholders; the
//     connection rewrites them to PostgreSQL's $1, $2, … (outside quoted
//     strings and comments), so the registry's SQL is one text for both.
//   - Arguments are sent with the types of their Go values (pgx's
//     QueryExecModeExec: int64 as bigint, string as text), so a parameter
//     in a SELECT list or compared with a literal is never guessed as
//     text or int4 by the server.
//   - Every migration runs in one transaction holding an advisory lock
//     (pg_advisory_xact_lock), so two gateways starting on an empty
//     database apply each version once; a database migrated by newer code
//     is refused.
//   - Lock takes a transaction-scoped advisory lock on a key: under READ
//     COMMITTED each later statement of the transaction sees every commit
//     made before the lock was granted, which is what the registry's
//     conditional inserts (budgets, rate windows) need to serialise across
//     processes — the role BEGIN IMMEDIATE plays on SQLite.
package postgres

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
)

// ErrInvalid reports a bad DSN or migrations; the message names the field.
var ErrInvalid = errors.New("invalid")

// IsDSN reports whether s names a PostgreSQL database (a postgres:// or
// postgresql:// URL) rather than a SQLite file.
func IsDSN(s string) bool {
	return strings.HasPrefix(s, "postgres://") || strings.HasPrefix(s, "postgresql://")
}

// Redact returns dsn with its password replaced by "xxxxx", for logs and
// errors; a DSN that does not parse becomes "postgres://…", and what is
// not a DSN (a SQLite file) is returned as it is.
func Redact(dsn string) string {
	if !IsDSN(dsn) {
		return dsn
	}
	u, err := url.Parse(dsn)
	if err != nil {
		return "postgres://…"
	}
	q := u.Query()
	if q.Has("password") {
		q.Set("password", "xxxxx")
		u.RawQuery = q.Encode()
	}
	return u.Redacted()
}

// Migration is one step of a schema, as in registry/sqlite: Version (1, 2,
// … without gaps), Name, SQL (statements separated by ";") and an optional
// Up, all in one transaction.
type Migration struct {
	Version int
	Name    string
	SQL     string
	Up      func(ctx context.Context, tx *sql.Tx) error
}

// Options tune Open.
type Options struct {
	// MaxOpenConns bounds the pool (default 16).
	MaxOpenConns int
}

const migrationsTable = `CREATE TABLE IF NOT EXISTS schema_migrations (
	version INTEGER PRIMARY KEY,
	name    TEXT NOT NULL,
	applied BIGINT NOT NULL -- unix ms
)`

// migrationLock is the advisory lock key migrations run under.
const migrationLock = "molly/schema_migrations"

// Open connects to the database at dsn and applies the migrations it has
// not applied yet, in order. Errors carry the DSN without its password:
// a DSN that does not parse (ErrInvalid), migrations out of order
// (ErrInvalid), the server unreachable, a database migrated by newer code,
// a failing migration (nothing of it is kept).
func Open(dsn string, opts Options, migrations ...Migration) (*sql.DB, error) {
	shown := Redact(dsn)
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("postgres: %s: %w", shown, ErrInvalid)
	}
	for i, m := range migrations {
		if m.Version != i+1 {
			return nil, fmt.Errorf("postgres: migration %d (%s) must have version %d: %w", m.Version, m.Name, i+1, ErrInvalid)
		}
	}
	cfg.DefaultQueryExecMode = pgx.QueryExecModeExec
	db := sql.OpenDB(rebindConnector{stdlib.GetConnector(*cfg)})
	conns := opts.MaxOpenConns
	if conns <= 0 {
		conns = 16
	}
	db.SetMaxOpenConns(conns)
	db.SetMaxIdleConns(conns)
	db.SetConnMaxIdleTime(5 * time.Minute)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := db.PingContext(ctx); err != nil {
		db.Close()
		return nil, fmt.Errorf("postgres: connecting to %s: %w", shown, err)
	}
	if err := migrate(ctx, db, migrations); err != nil {
		db.Close()
		return nil, fmt.Errorf("postgres: %s: %w", shown, err)
	}
	return db, nil
}

// Lock takes the transaction-scoped advisory lock of key in tx (released
// at commit or rollback); transactions locking the same key run one after
// the other. Keys are per schema (current_schema()): two registries in
// two schemas of one database do not wait for each other.
func Lock(ctx context.Context, tx *sql.Tx, key string) error {
	_, err := tx.ExecContext(ctx, `SELECT pg_advisory_xact_lock(hashtextextended(current_schema() || '/' || ?, 0))`, key)
	return err
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

// apply runs m unless it is recorded, in one transaction under the
// migration lock.
func apply(ctx context.Context, db *sql.DB, m Migration) error {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("migration %d (%s): %w", m.Version, m.Name, err)
	}
	defer tx.Rollback()
	if err := Lock(ctx, tx, migrationLock); err != nil {
		return fmt.Errorf("migration %d (%s): %w", m.Version, m.Name, err)
	}
	if _, err := tx.ExecContext(ctx, migrationsTable); err != nil {
		return fmt.Errorf("creating schema_migrations: %w", err)
	}
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

// statements splits a migration's SQL at the ";" that end statements,
// outside quotes and "--" comments, dropping empty ones.
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
	return out
}

// Rebind rewrites the "?" placeholders of query to $1, $2, … in order,
// leaving those inside single-quoted strings, double-quoted identifiers
// and "--" comments alone.
func Rebind(query string) string {
	if !strings.Contains(query, "?") {
		return query
	}
	var b strings.Builder
	b.Grow(len(query) + 8)
	n := 0
	var quote byte
	comment := false
	for i := 0; i < len(query); i++ {
		c := query[i]
		switch {
		case comment:
			comment = c != '\n'
		case quote != 0:
			if c == quote {
				quote = 0
			}
		case c == '\'' || c == '"':
			quote = c
		case c == '-' && i+1 < len(query) && query[i+1] == '-':
			comment = true
		case c == '?':
			n++
			b.WriteByte('$')
			b.WriteString(fmt.Sprint(n))
			continue
		}
		b.WriteByte(c)
	}
	return b.String()
}

// rebindConnector hands out connections that rebind placeholders.
type rebindConnector struct{ driver.Connector }

func (c rebindConnector) Connect(ctx context.Context) (driver.Conn, error) {
	conn, err := c.Connector.Connect(ctx)
	if err != nil {
		return nil, err
	}
	return &rebindConn{conn.(*stdlib.Conn)}, nil
}

// rebindConn is pgx's connection with every statement's text rebound; the
// rest (transactions, ping, session reset, named values) is pgx's.
type rebindConn struct{ *stdlib.Conn }

func (c *rebindConn) Prepare(query string) (driver.Stmt, error) {
	return c.Conn.Prepare(Rebind(query))
}

func (c *rebindConn) PrepareContext(ctx context.Context, query string) (driver.Stmt, error) {
	return c.Conn.PrepareContext(ctx, Rebind(query))
}

func (c *rebindConn) ExecContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Result, error) {
	return c.Conn.ExecContext(ctx, Rebind(query), args)
}

func (c *rebindConn) QueryContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Rows, error) {
	return c.Conn.QueryContext(ctx, Rebind(query), args)
}

var (
	_ driver.ExecerContext      = (*rebindConn)(nil)
	_ driver.QueryerContext     = (*rebindConn)(nil)
	_ driver.ConnPrepareContext = (*rebindConn)(nil)
	_ driver.ConnBeginTx        = (*rebindConn)(nil)
	_ driver.SessionResetter    = (*rebindConn)(nil)
	_ driver.Pinger             = (*rebindConn)(nil)
	_ driver.NamedValueChecker  = (*rebindConn)(nil)
)
