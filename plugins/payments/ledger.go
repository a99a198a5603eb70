package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/molly-gateway/molly/plugins"
	"github.com/molly-gateway/molly/plugins/sqlstore"
)

// Ledger is the payments book of record: intents, transactions and their
// double-entry postings, and the idempotency records, in one SQLite file
// (modernc.org/sqlite, WAL, synchronous=NORMAL: a committed call survives
// kill -9; see registry/sqlite for the reasoning).
//
// Double entry: every transaction posts entries whose signed amounts sum to
// zero in its currency; money flows from the account posted negative to the
// one posted positive. A capture posts customer:<id> −amount and
// merchant +amount; a refund the reverse. An account's balance is the sum
// of its entries, so across all accounts each currency sums to zero.
type Ledger struct {
	db  *sql.DB
	now func() time.Time
}

const ledgerSchema = `
CREATE TABLE IF NOT EXISTS intents (
	id           TEXT PRIMARY KEY,            -- "pi_" + 24 hex digits
	member       TEXT NOT NULL,               -- Molly member who created it
	customer     TEXT NOT NULL,
	amount       INTEGER NOT NULL CHECK (amount > 0),          -- minor units
	currency     TEXT NOT NULL,               -- ISO 4217
	captured     INTEGER NOT NULL DEFAULT 0 CHECK (captured BETWEEN 0 AND amount),
	refunded     INTEGER NOT NULL DEFAULT 0 CHECK (refunded BETWEEN 0 AND captured),
	description  TEXT NOT NULL DEFAULT '',
	provider     TEXT NOT NULL,
	provider_ref TEXT NOT NULL,               -- the provider's authorisation
	created      INTEGER NOT NULL             -- unix ms
);
CREATE TABLE IF NOT EXISTS transactions (
	id           INTEGER PRIMARY KEY,
	intent       TEXT NOT NULL REFERENCES intents(id),
	kind         TEXT NOT NULL CHECK (kind IN ('capture', 'refund')),
	amount       INTEGER NOT NULL CHECK (amount > 0),
	currency     TEXT NOT NULL,
	provider_ref TEXT NOT NULL,
	created      INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS entries (
	txn      INTEGER NOT NULL REFERENCES transactions(id),
	account  TEXT NOT NULL,
	amount   INTEGER NOT NULL,                -- signed minor units
	currency TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS entries_account ON entries(account, currency);
`

// OpenLedger opens (creating if needed) the ledger file at path.
func OpenLedger(path string) (*Ledger, error) {
	db, err := sqlstore.Open(path, ledgerSchema)
	if err != nil {
		return nil, fmt.Errorf("ledger: %w", err)
	}
	return &Ledger{db: db, now: time.Now}, nil
}

// Close closes the file.
func (l *Ledger) Close() error { return l.db.Close() }

// Intent is a payment intent as the tool returns it. Amounts are minor units.
type Intent struct {
	ID          string `json:"id"`
	Member      string `json:"member"`
	Customer    string `json:"customer"`
	Amount      int64  `json:"amount"`
	Currency    string `json:"currency"`
	Exponent    int    `json:"exponent"` // minor-unit exponent: amount/10^exponent major units
	Captured    int64  `json:"captured"`
	Refunded    int64  `json:"refunded"`
	Status      string `json:"status"` // requires_capture | partially_captured | captured | partially_refunded | refunded
	Description string `json:"description,omitempty"`
	Provider    string `json:"provider"`
	ProviderRef string `json:"provider_ref"`
	Created     int64  `json:"created"` // unix ms
}

func (in *Intent) derive() {
	in.Exponent = exponents[in.Currency]
	switch {
	case in.Captured == 0:
		in.Status = "requires_capture"
	case in.Refunded == in.Captured && in.Captured > 0 && in.Refunded > 0:
		in.Status = "refunded"
	case in.Refunded > 0:
		in.Status = "partially_refunded"
	case in.Captured < in.Amount:
		in.Status = "partially_captured"
	default:
		in.Status = "captured"
	}
}

// Transaction is one capture or refund with its postings.
type Transaction struct {
	ID          int64   `json:"id"`
	Intent      string  `json:"intent"`
	Kind        string  `json:"kind"` // capture | refund
	Amount      int64   `json:"amount"`
	Currency    string  `json:"currency"`
	ProviderRef string  `json:"provider_ref"`
	Entries     []Entry `json:"entries"`
	Created     int64   `json:"created"` // unix ms
}

// Entry is one posting: a signed amount in minor units on an account.
type Entry struct {
	Account string `json:"account"`
	Amount  int64  `json:"amount"`
}

// Balance is an account's balance in one currency, minor units, signed.
type Balance struct {
	Account  string `json:"account"`
	Currency string `json:"currency"`
	Balance  int64  `json:"balance"`
}

// MerchantAccount receives captures and pays refunds.
const MerchantAccount = "merchant"

// CustomerAccount is the ledger account of a customer.
func CustomerAccount(customer string) string { return "customer:" + customer }

// Idempotent runs fn in one transaction keyed by (member, key): the first
// call runs fn, stores its JSON result with reqHash and commits; a later
// call with the same key and hash returns the stored bytes without running
// fn; the same key with another hash is a "conflict" tool error. A failing
// fn stores nothing (its effects roll back), so a retry runs it again.
func (l *Ledger) Idempotent(ctx context.Context, member, key, reqHash string, fn func(tx *sql.Tx) (any, error)) (json.RawMessage, error) {
	return sqlstore.Idempotent(ctx, l.db, l.now(), "ledger", member, key, reqHash, fn)
}

// InsertIntent stores a new intent.
func (l *Ledger) InsertIntent(ctx context.Context, tx *sql.Tx, in *Intent) error {
	in.Created = l.now().UnixMilli()
	_, err := tx.ExecContext(ctx, `INSERT INTO intents (id, member, customer, amount, currency, description, provider, provider_ref, created)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)`, in.ID, in.Member, in.Customer, in.Amount, in.Currency, in.Description, in.Provider, in.ProviderRef, in.Created)
	if err != nil {
		return internal(err)
	}
	in.derive()
	return nil
}

// GetIntent reads an intent; a missing one is a "not_found" tool error.
func (l *Ledger) GetIntent(ctx context.Context, q interface {
	QueryRowContext(context.Context, string, ...any) *sql.Row
}, id string) (*Intent, error) {
	in := &Intent{ID: id}
	err := q.QueryRowContext(ctx, `SELECT member, customer, amount, currency, captured, refunded, description, provider, provider_ref, created
		FROM intents WHERE id = ?`, id).Scan(&in.Member, &in.Customer, &in.Amount, &in.Currency, &in.Captured, &in.Refunded,
		&in.Description, &in.Provider, &in.ProviderRef, &in.Created)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, plugins.Errorf(plugins.CodeNotFound, "no payment intent %q", id)
	}
	if err != nil {
		return nil, internal(err)
	}
	in.derive()
	return in, nil
}

// Post books a capture or refund of amount on in (already validated
// against its limits) with balanced entries, and updates in.
func (l *Ledger) Post(ctx context.Context, tx *sql.Tx, in *Intent, kind string, amount int64, providerRef string) (*Transaction, error) {
	t := &Transaction{Intent: in.ID, Kind: kind, Amount: amount, Currency: in.Currency, ProviderRef: providerRef, Created: l.now().UnixMilli()}
	switch kind {
	case "capture":
		t.Entries = []Entry{{CustomerAccount(in.Customer), -amount}, {MerchantAccount, amount}}
		in.Captured += amount
	case "refund":
		t.Entries = []Entry{{MerchantAccount, -amount}, {CustomerAccount(in.Customer), amount}}
		in.Refunded += amount
	default:
		return nil, internal(fmt.Errorf("unknown transaction kind %q", kind))
	}
	res, err := tx.ExecContext(ctx, `INSERT INTO transactions (intent, kind, amount, currency, provider_ref, created) VALUES (?, ?, ?, ?, ?, ?)`,
		t.Intent, t.Kind, t.Amount, t.Currency, t.ProviderRef, t.Created)
	if err != nil {
		return nil, internal(err)
	}
	if t.ID, err = res.LastInsertId(); err != nil {
		return nil, internal(err)
	}
	for _, e := range t.Entries {
		if _, err := tx.ExecContext(ctx, `INSERT INTO entries (txn, account, amount, currency) VALUES (?, ?, ?, ?)`, t.ID, e.Account, e.Amount, t.Currency); err != nil {
			return nil, internal(err)
		}
	}
	if _, err := tx.ExecContext(ctx, `UPDATE intents SET captured = ?, refunded = ? WHERE id = ?`, in.Captured, in.Refunded, in.ID); err != nil {
		return nil, internal(err)
	}
	in.derive()
	return t, nil
}

// Balances returns every account's balance per currency, sorted by account
// then currency.
func (l *Ledger) Balances(ctx context.Context) ([]Balance, error) {
	rows, err := l.db.QueryContext(ctx, `SELECT account, currency, SUM(amount) FROM entries GROUP BY account, currency ORDER BY account, currency`)
	if err != nil {
		return nil, internal(err)
	}
	defer rows.Close()
	out := []Balance{}
	for rows.Next() {
		var b Balance
		if err := rows.Scan(&b.Account, &b.Currency, &b.Balance); err != nil {
			return nil, internal(err)
		}
		out = append(out, b)
	}
	if err := rows.Err(); err != nil {
		return nil, internal(err)
	}
	return out, nil
}

func internal(err error) error {
	return plugins.Errorf(plugins.CodeInternal, "ledger: %v", err)
}
