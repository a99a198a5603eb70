// Package registry is Molly's durable store, on SQLite (modernc.org/sqlite,
// pure Go, WAL): members, their API keys (hashed), scopes, budgets and rate
// limits, and the usage ledger that budgets are charged against. It imports
// no Caddy and no router package; the Caddy glue adapts its types.
//
// Durability: every write is one transaction committed before the call
// returns, so whatever Molly acknowledged to a client is on disk. The file
// runs in WAL mode with synchronous=NORMAL: a committed transaction survives
// a crash of the process (kill -9), because the WAL write reaches the
// operating system before COMMIT returns; only a power loss or kernel crash
// can roll back the last transactions (https://www.sqlite.org/pragma.html#pragma_synchronous,
// https://www.sqlite.org/wal.html). Options.Synchronous "FULL" also fsyncs
// each commit, for machines where that matters.
package registry

import (
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	_ "modernc.org/sqlite" // the "sqlite" database/sql driver
)

// Errors returned by the registry; match them with errors.Is.
var (
	// ErrNotFound: no member, key or entry by that name or prefix.
	ErrNotFound = errors.New("not found")
	// ErrUnknownKey: the presented API key is not one the registry issued.
	ErrUnknownKey = errors.New("unknown API key")
	// ErrRevokedKey: the presented API key was revoked.
	ErrRevokedKey = errors.New("revoked API key")
	// ErrInvalid: a member or key field is out of range; the message names the field.
	ErrInvalid = errors.New("invalid")
)

// Options tune Open.
type Options struct {
	// Synchronous is SQLite's synchronous pragma: "NORMAL" (default; durable
	// across process crashes in WAL mode) or "FULL" (also across power loss).
	Synchronous string
	// Now is the clock (default time.Now); tests move it.
	Now func() time.Time
}

// Registry is an open registry file. Its methods are safe for concurrent use.
type Registry struct {
	db   *sql.DB
	path string
	now  func() time.Time

	mu      sync.Mutex
	windows map[string]*window // rate-limit windows per member, in memory

	resMu    sync.Mutex
	reserved map[string]reserved // what requests in flight hold, per member (Reserve)
}

const schema = `
CREATE TABLE IF NOT EXISTS members (
	name         TEXT PRIMARY KEY,
	budget_nusd  INTEGER NOT NULL DEFAULT 0, -- budget per period in nano-USD (1e-9 USD); 0: none
	period       TEXT NOT NULL DEFAULT '',   -- '', 'day' or 'month'
	period_start INTEGER NOT NULL DEFAULT 0, -- anchor of the periods, unix ms UTC
	rpm          INTEGER NOT NULL DEFAULT 0, -- requests per minute; 0: unlimited
	tpm          INTEGER NOT NULL DEFAULT 0, -- tokens per minute; 0: unlimited
	models       TEXT NOT NULL DEFAULT '',   -- scope: space-separated client model names; '': any
	tiers        TEXT NOT NULL DEFAULT '',   -- scope: space-separated tiers; '': any
	tools        TEXT NOT NULL DEFAULT '',   -- scope: space-separated tool names; '': any
	created      INTEGER NOT NULL            -- unix ms
);
CREATE TABLE IF NOT EXISTS keys (
	hash    BLOB PRIMARY KEY,                -- SHA-256 of the whole key
	prefix  TEXT NOT NULL UNIQUE,            -- first characters, for display and revocation
	member  TEXT NOT NULL REFERENCES members(name),
	name    TEXT NOT NULL DEFAULT '',
	created INTEGER NOT NULL,                -- unix ms
	revoked INTEGER NOT NULL DEFAULT 0       -- unix ms; 0: live
);
CREATE TABLE IF NOT EXISTS usage (
	id                INTEGER PRIMARY KEY,
	member            TEXT NOT NULL,
	decision_id       TEXT NOT NULL,
	model             TEXT NOT NULL,
	target            TEXT NOT NULL,
	tier              TEXT NOT NULL,
	prompt_tokens     INTEGER NOT NULL,
	completion_tokens INTEGER NOT NULL,
	estimated         INTEGER NOT NULL DEFAULT 0, -- 1: tokens counted by Molly, not reported by the upstream
	cost_nusd         INTEGER NOT NULL,           -- nano-USD
	ts                INTEGER NOT NULL            -- unix ms
);
CREATE INDEX IF NOT EXISTS usage_member_ts ON usage(member, ts);
`

// Open opens (creating if needed) the registry file at path and its folder.
// Errors: the folder cannot be made, the file cannot be opened or migrated.
func Open(path string, opts Options) (*Registry, error) {
	if path == "" {
		return nil, fmt.Errorf("registry: empty path")
	}
	mode := strings.ToUpper(opts.Synchronous)
	switch mode {
	case "":
		mode = "NORMAL"
	case "NORMAL", "FULL":
	default:
		return nil, fmt.Errorf("registry: synchronous %q must be NORMAL or FULL: %w", opts.Synchronous, ErrInvalid)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("registry: %w", err)
	}
	q := url.Values{}
	for _, p := range []string{"journal_mode(WAL)", "synchronous(" + mode + ")", "busy_timeout(5000)", "foreign_keys(1)"} {
		q.Add("_pragma", p)
	}
	db, err := sql.Open("sqlite", "file:"+path+"?"+q.Encode())
	if err != nil {
		return nil, fmt.Errorf("registry: opening %s: %w", path, err)
	}
	// One connection: writes serialise anyway, and the ledger's few reads
	// are short; this rules out SQLITE_BUSY between our own connections.
	db.SetMaxOpenConns(1)
	if _, err := db.Exec(schema); err != nil {
		db.Close()
		return nil, fmt.Errorf("registry: creating the schema in %s: %w", path, err)
	}
	now := opts.Now
	if now == nil {
		now = time.Now
	}
	_ = os.Chmod(path, 0o600) // key hashes and spend are nobody else's business
	r := &Registry{db: db, path: path, now: now, windows: map[string]*window{}, reserved: map[string]reserved{}}
	if err := r.loadWindows(); err != nil {
		db.Close()
		return nil, err
	}
	return r, nil
}

// Path is the file the registry lives in.
func (r *Registry) Path() string { return r.path }

// Close closes the file.
func (r *Registry) Close() error { return r.db.Close() }

// nusd converts USD to integer nano-USD, the unit money is stored in, so
// that sums are exact and a budget trips at exactly the request that spends it.
func nusd(usd float64) int64 {
	if usd >= 0 {
		return int64(usd*1e9 + 0.5)
	}
	return -int64(-usd*1e9 + 0.5)
}

func usd(n int64) float64 { return float64(n) / 1e9 }

func ms(t time.Time) int64 { return t.UnixMilli() }

func fromMS(v int64) time.Time {
	if v == 0 {
		return time.Time{}
	}
	return time.UnixMilli(v).UTC()
}

func words(s string) []string {
	if s == "" {
		return nil
	}
	return strings.Fields(s)
}
