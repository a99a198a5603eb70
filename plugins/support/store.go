package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/molly-gateway/molly/plugins"
	"github.com/molly-gateway/molly/plugins/sqlstore"
)

// Store holds the tickets, their comments and the idempotency records in
// one SQLite file, opened as the payments ledger is (modernc.org/sqlite,
// WAL, synchronous=NORMAL: a committed call survives kill -9; see
// registry/sqlite for the reasoning).
type Store struct {
	db  *sql.DB
	now func() time.Time
}

const storeSchema = `
CREATE TABLE IF NOT EXISTS tickets (
	id              TEXT PRIMARY KEY,         -- "tk_" + 24 hex digits
	requester       TEXT NOT NULL,            -- Molly member who opened it
	subject         TEXT NOT NULL,
	body            TEXT NOT NULL DEFAULT '',
	status          TEXT NOT NULL CHECK (status IN ('open', 'pending', 'solved', 'closed')),
	assignee        TEXT NOT NULL DEFAULT '',
	conversation_id TEXT NOT NULL DEFAULT '',
	decision_id     TEXT NOT NULL DEFAULT '',
	created         INTEGER NOT NULL,         -- unix ms
	updated         INTEGER NOT NULL          -- unix ms
);
CREATE INDEX IF NOT EXISTS tickets_status ON tickets(status, created);
CREATE TABLE IF NOT EXISTS comments (
	id      INTEGER PRIMARY KEY,
	ticket  TEXT NOT NULL REFERENCES tickets(id),
	author  TEXT NOT NULL,
	body    TEXT NOT NULL,
	created INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS comments_ticket ON comments(ticket, id);
`

// OpenStore opens (creating if needed) the ticket file at path.
func OpenStore(path string) (*Store, error) {
	db, err := sqlstore.Open(path, storeSchema)
	if err != nil {
		return nil, fmt.Errorf("store: %w", err)
	}
	return &Store{db: db, now: time.Now}, nil
}

// Close closes the file.
func (s *Store) Close() error { return s.db.Close() }

// Ticket is a support ticket as the tool returns it. Created and Updated
// are unix ms; Assignee is empty when nobody is assigned.
type Ticket struct {
	ID             string `json:"id"`
	Requester      string `json:"requester"`
	Subject        string `json:"subject"`
	Body           string `json:"body,omitempty"`
	Status         string `json:"status"` // open | pending | solved | closed
	Assignee       string `json:"assignee,omitempty"`
	ConversationID string `json:"conversation_id,omitempty"`
	DecisionID     string `json:"decision_id,omitempty"`
	Comments       int    `json:"comments"` // how many comments it has
	Created        int64  `json:"created"`
	Updated        int64  `json:"updated"`
}

// Comment is one comment on a ticket; Created is unix ms.
type Comment struct {
	ID      int64  `json:"id"`
	Ticket  string `json:"ticket"`
	Author  string `json:"author"`
	Body    string `json:"body"`
	Created int64  `json:"created"`
}

// Filter selects tickets for List; empty fields match everything.
type Filter struct {
	Status, Requester, Assignee, ConversationID, DecisionID string
	// Limit is the most tickets returned (1..500).
	Limit int
}

// Idempotent runs fn in one transaction keyed by (member, key): the first
// call runs fn, stores its JSON result with reqHash and commits; a later
// call with the same key and hash returns the stored bytes without running
// fn; the same key with another hash is a "conflict" tool error. A failing
// fn stores nothing (its effects roll back), so a retry runs it again.
// (The payments ledger's scheme, unchanged.)
func (s *Store) Idempotent(ctx context.Context, member, key, reqHash string, fn func(tx *sql.Tx) (any, error)) (json.RawMessage, error) {
	return sqlstore.Idempotent(ctx, s.db, s.now(), "store", member, key, reqHash, fn)
}

type querier interface {
	QueryRowContext(context.Context, string, ...any) *sql.Row
	QueryContext(context.Context, string, ...any) (*sql.Rows, error)
}

const ticketCols = `id, requester, subject, body, status, assignee, conversation_id, decision_id, created, updated,
	(SELECT COUNT(*) FROM comments c WHERE c.ticket = tickets.id)`

func scanTicket(sc interface{ Scan(...any) error }) (*Ticket, error) {
	t := &Ticket{}
	err := sc.Scan(&t.ID, &t.Requester, &t.Subject, &t.Body, &t.Status, &t.Assignee, &t.ConversationID, &t.DecisionID,
		&t.Created, &t.Updated, &t.Comments)
	return t, err
}

// InsertTicket stores a new ticket; it sets Created and Updated.
func (s *Store) InsertTicket(ctx context.Context, tx *sql.Tx, t *Ticket) error {
	t.Created = s.now().UnixMilli()
	t.Updated = t.Created
	_, err := tx.ExecContext(ctx, `INSERT INTO tickets (id, requester, subject, body, status, assignee, conversation_id, decision_id, created, updated)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`, t.ID, t.Requester, t.Subject, t.Body, t.Status, t.Assignee, t.ConversationID, t.DecisionID, t.Created, t.Updated)
	if err != nil {
		return internal(err)
	}
	return nil
}

// GetTicket reads a ticket; a missing one is a "not_found" tool error.
func (s *Store) GetTicket(ctx context.Context, q querier, id string) (*Ticket, error) {
	t, err := scanTicket(q.QueryRowContext(ctx, `SELECT `+ticketCols+` FROM tickets WHERE id = ?`, id))
	if errors.Is(err, sql.ErrNoRows) {
		return nil, plugins.Errorf(plugins.CodeNotFound, "no ticket %q", id)
	}
	if err != nil {
		return nil, internal(err)
	}
	return t, nil
}

// UpdateTicket writes t's status and assignee and sets Updated.
func (s *Store) UpdateTicket(ctx context.Context, tx *sql.Tx, t *Ticket) error {
	t.Updated = s.now().UnixMilli()
	if _, err := tx.ExecContext(ctx, `UPDATE tickets SET status = ?, assignee = ?, updated = ? WHERE id = ?`, t.Status, t.Assignee, t.Updated, t.ID); err != nil {
		return internal(err)
	}
	return nil
}

// InsertComment stores c on its ticket (and touches the ticket's Updated);
// it sets ID and Created.
func (s *Store) InsertComment(ctx context.Context, tx *sql.Tx, c *Comment) error {
	c.Created = s.now().UnixMilli()
	res, err := tx.ExecContext(ctx, `INSERT INTO comments (ticket, author, body, created) VALUES (?, ?, ?, ?)`, c.Ticket, c.Author, c.Body, c.Created)
	if err != nil {
		return internal(err)
	}
	if c.ID, err = res.LastInsertId(); err != nil {
		return internal(err)
	}
	if _, err := tx.ExecContext(ctx, `UPDATE tickets SET updated = ? WHERE id = ?`, c.Created, c.Ticket); err != nil {
		return internal(err)
	}
	return nil
}

// Comments returns a ticket's comments, oldest first.
func (s *Store) Comments(ctx context.Context, q querier, ticket string) ([]Comment, error) {
	rows, err := q.QueryContext(ctx, `SELECT id, ticket, author, body, created FROM comments WHERE ticket = ? ORDER BY id`, ticket)
	if err != nil {
		return nil, internal(err)
	}
	defer rows.Close()
	out := []Comment{}
	for rows.Next() {
		var c Comment
		if err := rows.Scan(&c.ID, &c.Ticket, &c.Author, &c.Body, &c.Created); err != nil {
			return nil, internal(err)
		}
		out = append(out, c)
	}
	if err := rows.Err(); err != nil {
		return nil, internal(err)
	}
	return out, nil
}

// List returns the tickets matching f, oldest first (creation order).
func (s *Store) List(ctx context.Context, f Filter) ([]Ticket, error) {
	var where []string
	var args []any
	for _, c := range []struct{ col, v string }{{"status", f.Status}, {"requester", f.Requester}, {"assignee", f.Assignee},
		{"conversation_id", f.ConversationID}, {"decision_id", f.DecisionID}} {
		if c.v != "" {
			where = append(where, c.col+" = ?")
			args = append(args, c.v)
		}
	}
	q := `SELECT ` + ticketCols + ` FROM tickets`
	if len(where) > 0 {
		q += ` WHERE ` + strings.Join(where, " AND ")
	}
	q += ` ORDER BY created, rowid LIMIT ?`
	args = append(args, f.Limit)
	rows, err := s.db.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, internal(err)
	}
	defer rows.Close()
	out := []Ticket{}
	for rows.Next() {
		t, err := scanTicket(rows)
		if err != nil {
			return nil, internal(err)
		}
		out = append(out, *t)
	}
	if err := rows.Err(); err != nil {
		return nil, internal(err)
	}
	return out, nil
}

func internal(err error) error {
	return plugins.Errorf(plugins.CodeInternal, "store: %v", err)
}
