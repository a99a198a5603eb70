// Package registry is Molly's durable store, on SQLite (modernc.org/sqlite,
// pure Go, WAL, opened by registry/sqlite) by default or on PostgreSQL
// (pgx, opened by registry/postgres) for a fleet of gateways sharing one
// store: members, their API keys (hashed),
// scopes, budgets and rate limits; the usage ledger, the book of record that
// budgets are charged against and the billing tool is fed from (a
// transactional outbox); the reservations of requests in flight; the RPM
// windows; the learned routing priors. It imports no Caddy and no router
// package; the Caddy glue adapts its types.
//
// Durability: every write is one transaction committed before the call
// returns, so whatever Molly acknowledged to a client is on disk and
// survives kill -9 (see registry/sqlite for the pragmas and why).
//
// Coordination: on SQLite every transaction begins IMMEDIATE, so several
// Registry handles on one file — several gateway processes — serialise
// their admissions and records exactly: two processes cannot together
// overshoot a budget or a TPM, and record ids stay unique. On PostgreSQL
// the transactions that read before they write take an advisory lock
// first (per member for admissions and records, per sink for deliveries),
// which serialises them the same way across every gateway on the database.
package registry

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/molly-gateway/molly/registry/postgres"
	"github.com/molly-gateway/molly/registry/sqlite"
)

// Errors returned by the registry; match them with errors.Is.
var (
	// ErrNotFound: no member, key or entry by that name or prefix.
	ErrNotFound = errors.New("not found")
	// ErrUnknownKey: the presented API key is not one the registry issued.
	ErrUnknownKey = errors.New("unknown API key")
	// ErrRevokedKey: the presented API key was revoked.
	ErrRevokedKey = errors.New("revoked API key")
	// ErrInvalid: a member, key, scope or option is out of range; the message
	// names the field. The same value as sqlite.ErrInvalid.
	ErrInvalid = sqlite.ErrInvalid
)

// DefaultLease is how long a reservation outlives the process that made it:
// a live Registry renews its reservations every Lease/4, so only a process
// that died (kill -9) lets them expire and free the budget they held.
const DefaultLease = 2 * time.Minute

// AutoCheckpointPages is the registry file's WAL checkpoint threshold
// (sqlite.Options.AutoCheckpoint): 4096 pages, a WAL of 16 MiB at most.
// Every record dirties about five pages, so with SQLite's default (1000)
// one Record in about 180 also checkpointed, syncing the WAL and the file
// inside its commit (milliseconds on a virtual disk: the 99th percentile
// of Record); with 4096 one in about 750 does. Records are as durable
// either way (in the WAL before COMMIT returns).
const AutoCheckpointPages = 4096

// Options tune Open.
type Options struct {
	// Synchronous is SQLite's synchronous pragma: "NORMAL" (default; durable
	// across process crashes in WAL mode) or "FULL" (also across power loss).
	// PostgreSQL commits durably by its own settings (synchronous_commit).
	Synchronous string
	// Now is the clock (default time.Now); tests move it.
	Now func() time.Time
	// Lease is how long reservations of this handle stay valid without
	// renewal (default DefaultLease).
	Lease time.Duration
}

// Registry is an open registry file. Its methods are safe for concurrent use.
type Registry struct {
	db    *sql.DB
	path  string
	pg    bool // on PostgreSQL: advisory locks instead of IMMEDIATE, no prepared statements
	now   func() time.Time
	lease time.Duration
	// owner names this handle in the reservations it holds (random).
	owner string
	live  atomic.Int64 // reservations of this handle not yet released

	stmts map[string]*sql.Stmt // preparedQueries, prepared at Open; read-only after

	group  groupCommit // Record's group commit (SQLite)
	recent recentSet   // decisions recorded lately (recordBatchAs)

	jmu       sync.Mutex
	journal   *journal // Journal's, from its first call (journal.go)
	noJournal bool     // Journal is Record: PostgreSQL, synchronous=FULL, no journal files possible

	wakeMu sync.Mutex
	wake   map[chan struct{}]struct{} // deliverers to nudge after a record commits

	stop chan struct{}
	done chan struct{}
}

// Open opens (creating if needed, with its folder) the registry file at path
// and brings its schema up to date (migrations.go); a path that is a
// postgres:// or postgresql:// URL opens that PostgreSQL database instead
// (registry/postgres; the schema from migrations_postgres.go). Errors:
// ErrInvalid for bad options; the folder cannot be made, the file or
// database cannot be opened or migrated (a DSN appears in errors without
// its password).
func Open(path string, opts Options) (*Registry, error) {
	if path == "" {
		return nil, fmt.Errorf("registry: empty path: %w", ErrInvalid)
	}
	now := opts.Now
	if now == nil {
		now = time.Now
	}
	if opts.Lease < 0 {
		return nil, fmt.Errorf("registry: lease %v must not be negative: %w", opts.Lease, ErrInvalid)
	}
	lease := opts.Lease
	if lease == 0 {
		lease = DefaultLease
	}
	pg := postgres.IsDSN(path)
	var db *sql.DB
	var err error
	if pg {
		db, err = postgres.Open(path, postgres.Options{}, pgMigrations()...)
		path = postgres.Redact(path)
	} else {
		db, err = sqlite.Open(path, sqlite.Options{Synchronous: opts.Synchronous, AutoCheckpoint: AutoCheckpointPages}, migrations()...)
	}
	if err != nil {
		return nil, fmt.Errorf("registry: %w", err)
	}
	var id [8]byte
	_, _ = rand.Read(id[:])
	r := &Registry{db: db, path: path, pg: pg, now: now, lease: lease, owner: hex.EncodeToString(id[:]),
		stmts: map[string]*sql.Stmt{}, wake: map[chan struct{}]struct{}{}, stop: make(chan struct{}), done: make(chan struct{})}
	if err := r.prepare(); err != nil {
		db.Close()
		return nil, fmt.Errorf("registry: %s: %w", path, err)
	}
	r.noJournal = pg || strings.EqualFold(opts.Synchronous, "FULL") || strings.EqualFold(opts.Synchronous, "EXTRA")
	if !pg {
		// Usage journals of processes that died (journal.go) go into the
		// ledger before this handle serves anything.
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		err := r.recoverJournals(ctx)
		cancel()
		if err != nil {
			db.Close()
			return nil, fmt.Errorf("registry: %s: %w", path, err)
		}
	}
	go r.renewLeases()
	return r, nil
}

// Path is the file the registry lives in (a PostgreSQL DSN without its
// password).
func (r *Registry) Path() string { return r.path }

// Close commits what the handle's usage journal holds and removes it,
// stops renewing this handle's reservations and closes the file.
// Reservations not released stay until their lease expires.
func (r *Registry) Close() error {
	r.jmu.Lock()
	select {
	case <-r.stop:
	default:
		close(r.stop)
	}
	j := r.journal
	r.journal, r.noJournal = nil, true
	r.jmu.Unlock()
	if j != nil {
		j.close()
	}
	<-r.done
	return r.db.Close()
}

// renewLeases extends the leases of this handle's live reservations every
// lease/4, so that they expire only when the process is gone.
func (r *Registry) renewLeases() {
	defer close(r.done)
	t := time.NewTicker(r.lease / 4)
	defer t.Stop()
	for {
		select {
		case <-r.stop:
			return
		case <-t.C:
			if !r.pg {
				// A process on the file that died meanwhile: its journal.
				ctx, cancel := context.WithTimeout(context.Background(), r.lease/4)
				_ = r.recoverJournals(ctx) // tried again on the next tick
				cancel()
			}
			if r.live.Load() == 0 {
				continue
			}
			ctx, cancel := context.WithTimeout(context.Background(), r.lease/4)
			_, _ = r.db.ExecContext(ctx, `UPDATE reservations SET expires = ? WHERE owner = ?`, ms(r.now().Add(r.lease)), r.owner)
			cancel()
		}
	}
}

// tx runs fn in one (IMMEDIATE) transaction and commits it.
func (r *Registry) tx(ctx context.Context, fn func(tx *sql.Tx) error) error {
	tx, err := r.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	if err := fn(tx); err != nil {
		return err
	}
	return tx.Commit()
}

// NanoUSD converts USD to integer nano-USD (1 USD = 1e9), the unit money is
// stored in, rounding half away from zero, so that sums are exact and a
// budget trips at exactly the request that spends it.
func NanoUSD(usd float64) int64 {
	if usd >= 0 {
		return int64(usd*1e9 + 0.5)
	}
	return -int64(-usd*1e9 + 0.5)
}

func nusd(usd float64) int64 { return NanoUSD(usd) }

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

// prepare prepares preparedQueries on the handle. Parsing and planning a
// statement is most of a small statement's cost in SQLite, and the request
// path runs the same few over and over; database/sql re-prepares them by
// itself on a new connection.
func (r *Registry) prepare() error {
	if r.pg {
		// A server-side prepared statement has its parameter types guessed
		// by the server (a "?" in a SELECT list becomes text); unprepared
		// statements send the Go types (registry/postgres).
		return nil
	}
	for _, query := range preparedQueries {
		s, err := r.db.Prepare(query)
		if err != nil {
			return fmt.Errorf("preparing %.40q: %w", query, err)
		}
		r.stmts[query] = s
	}
	return nil
}

// q runs statements inside one transaction, prepared ones where the query
// is among preparedQueries.
type q struct {
	ctx context.Context
	tx  *sql.Tx
	r   *Registry
}

func (q q) exec(query string, args ...any) (sql.Result, error) {
	if s, ok := q.r.stmts[query]; ok {
		return q.tx.StmtContext(q.ctx, s).ExecContext(q.ctx, args...)
	}
	return q.tx.ExecContext(q.ctx, query, args...)
}

func (q q) row(query string, args ...any) scanner {
	if s, ok := q.r.stmts[query]; ok {
		return q.tx.StmtContext(q.ctx, s).QueryRowContext(q.ctx, args...)
	}
	return q.tx.QueryRowContext(q.ctx, query, args...)
}

func (q q) rows(query string, args ...any) (*sql.Rows, error) {
	if s, ok := q.r.stmts[query]; ok {
		return q.tx.StmtContext(q.ctx, s).QueryContext(q.ctx, args...)
	}
	return q.tx.QueryContext(q.ctx, query, args...)
}

// row and exec run a statement outside a transaction, prepared where the
// query is among preparedQueries.
func (r *Registry) row(ctx context.Context, query string, args ...any) scanner {
	if s, ok := r.stmts[query]; ok {
		return s.QueryRowContext(ctx, args...)
	}
	return r.db.QueryRowContext(ctx, query, args...)
}

func (r *Registry) exec(ctx context.Context, query string, args ...any) (sql.Result, error) {
	if s, ok := r.stmts[query]; ok {
		return s.ExecContext(ctx, args...)
	}
	return r.db.ExecContext(ctx, query, args...)
}

type scanner interface{ Scan(dest ...any) error }

// lock serialises the transactions that lock the same key across every
// handle on the store: on PostgreSQL an advisory lock held to the end of
// tx; on SQLite nothing, as every transaction already holds the write lock.
func (r *Registry) lock(ctx context.Context, tx *sql.Tx, key string) error {
	if !r.pg {
		return nil
	}
	return postgres.Lock(ctx, tx, key)
}

// lock is Registry.lock in q's transaction.
func (q q) lock(key string) error { return q.r.lock(q.ctx, q.tx, key) }

// Lock keys.
func memberLock(name string) string { return "member/" + name }

const (
	recordIDLock = "usage/record-ids" // records without a decision id number themselves
	metaLock     = "meta"
)

// txq runs fn in one (IMMEDIATE) transaction and commits it.
func (r *Registry) txq(ctx context.Context, fn func(q q) error) error {
	return r.tx(ctx, func(tx *sql.Tx) error { return fn(q{ctx, tx, r}) })
}
