package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
)

// Provider is the payment rail behind the ledger: a card processor, a bank
// API, or (default) nothing at all. The ledger is always the book of record;
// a provider moves the real money and returns its own reference.
//
// Every method gets an idempotency key derived from the caller's, and must
// honour it (as e.g. Stripe's Idempotency-Key header does), because the tool
// calls the provider before it commits the ledger: after a crash between the
// two, the retried call reaches the provider again with the same key and
// must not move money twice. Amounts are integer minor units of currency
// (ISO 4217). Errors are returned to the caller as tool errors and nothing
// is booked.
type Provider interface {
	// Name identifies the provider in intents ("local").
	Name() string
	// Authorize reserves amount for customer and returns the provider's
	// reference of the authorisation.
	Authorize(ctx context.Context, customer string, amount int64, currency, key string) (ref string, err error)
	// Capture takes amount (at most what is authorised and not captured)
	// of the authorisation authRef; it returns the capture's reference.
	Capture(ctx context.Context, authRef string, amount int64, currency, key string) (ref string, err error)
	// Refund returns amount (at most what is captured and not refunded) of
	// the authorisation authRef; it returns the refund's reference.
	Refund(ctx context.Context, authRef string, amount int64, currency, key string) (ref string, err error)
}

// LocalProvider is the default provider: no external rail, money moves only
// in the local ledger. Its references are derived from the idempotency key,
// so it is idempotent by construction.
type LocalProvider struct{}

// Name returns "local".
func (LocalProvider) Name() string { return "local" }

// Authorize always succeeds: the local ledger holds no real funds to check.
func (LocalProvider) Authorize(_ context.Context, _ string, _ int64, _, key string) (string, error) {
	return localRef("auth", key), nil
}

// Capture always succeeds; the ledger books the money.
func (LocalProvider) Capture(_ context.Context, _ string, _ int64, _, key string) (string, error) {
	return localRef("cap", key), nil
}

// Refund always succeeds; the ledger books the money.
func (LocalProvider) Refund(_ context.Context, _ string, _ int64, _, key string) (string, error) {
	return localRef("ref", key), nil
}

func localRef(kind, key string) string {
	h := sha256.Sum256([]byte(key))
	return "local_" + kind + "_" + hex.EncodeToString(h[:8])
}

var _ Provider = LocalProvider{}
