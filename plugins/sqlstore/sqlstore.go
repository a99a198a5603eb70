// Package sqlstore opens the SQLite file a tool plugin keeps its state in,
// the same way for every plugin and for the registry: through
// registry/sqlite (WAL, synchronous=NORMAL — durable across a process kill —,
// a 5 s busy timeout, foreign keys on, IMMEDIATE transactions, one
// connection, the file private to its owner), with the plugin's schema and
// the shared idempotency table as its first versioned migration.
package sqlstore

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"time"

	"github.com/molly-gateway/molly/plugins"
	"github.com/molly-gateway/molly/registry/sqlite"
)

// IdempotencySchema is the table every plugin records replayable results
// in: the first result of (member, key), returned verbatim on a retry.
const IdempotencySchema = `
CREATE TABLE IF NOT EXISTS idempotency (
	member       TEXT NOT NULL,
	key          TEXT NOT NULL,
	request_hash TEXT NOT NULL,               -- SHA-256 of the operation and its arguments
	response     BLOB NOT NULL,               -- the first result, returned verbatim on replay
	created      INTEGER NOT NULL,
	PRIMARY KEY (member, key)
);
`

// Open opens (creating if needed) the database file at path with schema
// plus IdempotencySchema as migration 1 (CREATE … IF NOT EXISTS statements,
// so a file made before migrations were versioned adopts it); later
// versions of a plugin's schema go in more, applied in order. Errors name
// the path.
func Open(path, schema string, more ...sqlite.Migration) (*sql.DB, error) {
	migrations := append([]sqlite.Migration{{Version: 1, Name: "schema", SQL: schema + IdempotencySchema}}, more...)
	db, err := sqlite.Open(path, sqlite.Options{}, migrations...)
	if err != nil {
		return nil, err
	}
	return db, nil
}

// Idempotent runs fn in one transaction of db unless (member, key) already
// has a result: a call with the same key and request hash returns the
// stored bytes without running fn; the same key with another hash is a
// "conflict" tool error. A failing fn stores nothing (its effects roll
// back), so a retry runs it again. now stamps the record. Database errors
// are "internal" tool errors prefixed with what (e.g. "ledger").
func Idempotent(ctx context.Context, db *sql.DB, now time.Time, what, member, key, reqHash string, fn func(tx *sql.Tx) (any, error)) (json.RawMessage, error) {
	internal := func(err error) error { return plugins.Errorf(plugins.CodeInternal, "%s: %v", what, err) }
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return nil, internal(err)
	}
	defer tx.Rollback()
	var hash string
	var resp []byte
	err = tx.QueryRowContext(ctx, `SELECT request_hash, response FROM idempotency WHERE member = ? AND key = ?`, member, key).Scan(&hash, &resp)
	switch {
	case err == nil:
		if hash != reqHash {
			return nil, plugins.Errorf(plugins.CodeConflict, "idempotency key %q was used with different arguments", key)
		}
		return resp, nil
	case !errors.Is(err, sql.ErrNoRows):
		return nil, internal(err)
	}
	v, err := fn(tx)
	if err != nil {
		return nil, err
	}
	b, err := json.Marshal(v)
	if err != nil {
		return nil, internal(err)
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO idempotency (member, key, request_hash, response, created) VALUES (?, ?, ?, ?, ?)`,
		member, key, reqHash, b, now.UnixMilli()); err != nil {
		return nil, internal(err)
	}
	if err := tx.Commit(); err != nil {
		return nil, internal(err)
	}
	return b, nil
}
