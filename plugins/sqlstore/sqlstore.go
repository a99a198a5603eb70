// Package sqlstore opens the SQLite file a tool plugin keeps its state in,
// the same way for every plugin: WAL, synchronous=NORMAL (durable across a
// process kill; FULL would also cover power loss), a 5 s busy timeout,
// foreign keys on, one connection (each call is one transaction, run one at
// a time, so no SQLITE_BUSY), the file private to its owner, and the shared
// idempotency table created beside the plugin's own schema.
package sqlstore

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"time"

	_ "modernc.org/sqlite" // the "sqlite" database/sql driver

	"github.com/molly-gateway/molly/plugins"
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

// Open opens (creating if needed) the database file at path and applies
// schema plus IdempotencySchema. Errors name the path.
func Open(path, schema string) (*sql.DB, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, err
	}
	q := url.Values{}
	for _, p := range []string{"journal_mode(WAL)", "synchronous(NORMAL)", "busy_timeout(5000)", "foreign_keys(1)"} {
		q.Add("_pragma", p)
	}
	db, err := sql.Open("sqlite", "file:"+path+"?"+q.Encode())
	if err != nil {
		return nil, fmt.Errorf("opening %s: %w", path, err)
	}
	db.SetMaxOpenConns(1)
	if _, err := db.Exec(schema + IdempotencySchema); err != nil {
		db.Close()
		return nil, fmt.Errorf("creating the schema in %s: %w", path, err)
	}
	_ = os.Chmod(path, 0o600)
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
