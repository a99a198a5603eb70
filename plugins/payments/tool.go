package main

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"regexp"

	"github.com/molly-gateway/molly/plugins"
)

// Tool is the payments tool: one tool, several operations chosen by "op".
type Tool struct {
	ledger   *Ledger
	provider Provider
}

// Args are the tool's arguments (see argsSchema). Amount is in minor units
// of Currency; on capture it defaults to what is left to capture, on refund
// to what is left to refund.
type Args struct {
	Op          string `json:"op"` // create_intent | capture | refund | get_intent | balances
	IntentID    string `json:"intent_id,omitempty"`
	Amount      *int64 `json:"amount,omitempty"`
	Currency    string `json:"currency,omitempty"`
	Customer    string `json:"customer,omitempty"`
	Description string `json:"description,omitempty"`
}

const argsSchema = `{
  "$schema": "https://json-schema.org/draft/2020-12/schema",
  "type": "object",
  "additionalProperties": false,
  "required": ["op"],
  "properties": {
    "op": {"enum": ["create_intent", "capture", "refund", "get_intent", "balances"],
           "description": "create_intent needs amount, currency, customer; capture and refund need intent_id (amount optional: the rest); get_intent needs intent_id; balances needs nothing"},
    "intent_id": {"type": "string", "pattern": "^pi_[0-9a-f]{24}$"},
    "amount": {"type": "integer", "minimum": 1, "maximum": 9007199254740991, "description": "integer minor units of currency (cents for USD, yen for JPY)"},
    "currency": {"type": "string", "pattern": "^[A-Z]{3}$", "description": "ISO 4217 alphabetic code"},
    "customer": {"type": "string", "pattern": "^[A-Za-z0-9_.@-]{1,128}$"},
    "description": {"type": "string", "maxLength": 500}
  }
}`

const resultSchema = `{
  "$schema": "https://json-schema.org/draft/2020-12/schema",
  "type": "object",
  "properties": {
    "intent": {"type": "object", "required": ["id", "amount", "currency", "captured", "refunded", "status"],
      "properties": {
        "id": {"type": "string"}, "member": {"type": "string"}, "customer": {"type": "string"},
        "amount": {"type": "integer"}, "currency": {"type": "string"}, "exponent": {"type": "integer"},
        "captured": {"type": "integer"}, "refunded": {"type": "integer"},
        "status": {"enum": ["requires_capture", "partially_captured", "captured", "partially_refunded", "refunded"]},
        "description": {"type": "string"}, "provider": {"type": "string"}, "provider_ref": {"type": "string"},
        "created": {"type": "integer", "description": "unix ms"}}},
    "transaction": {"type": "object", "properties": {
        "id": {"type": "integer"}, "intent": {"type": "string"}, "kind": {"enum": ["capture", "refund"]},
        "amount": {"type": "integer"}, "currency": {"type": "string"}, "provider_ref": {"type": "string"},
        "entries": {"type": "array", "items": {"type": "object", "properties": {"account": {"type": "string"}, "amount": {"type": "integer"}}}},
        "created": {"type": "integer"}}},
    "balances": {"type": "array", "items": {"type": "object", "properties": {
        "account": {"type": "string"}, "currency": {"type": "string"}, "balance": {"type": "integer"}}}}
  }
}`

// Result is the tool's result; which fields are set depends on the op.
type Result struct {
	Intent      *Intent      `json:"intent,omitempty"`
	Transaction *Transaction `json:"transaction,omitempty"`
	Balances    []Balance    `json:"balances,omitempty"`
}

// Describe implements plugins.Tool.
func (t *Tool) Describe(context.Context) (plugins.Description, error) {
	return plugins.Description{
		Name:         "payments",
		Description:  "Create payment intents, capture and refund them; amounts in integer minor units with an ISO 4217 currency. Every call that moves money needs an idempotency key.",
		ArgsSchema:   json.RawMessage(argsSchema),
		ResultSchema: json.RawMessage(resultSchema),
		SideEffect:   plugins.Money,
	}, nil
}

var customerRE = regexp.MustCompile(`^[A-Za-z0-9_.@-]{1,128}$`)

// Invoke implements plugins.Tool. Errors are *plugins.ToolError:
// invalid_argument (bad args, missing idempotency key or caller),
// not_found (unknown intent, or one of another member), failed_precondition
// (capture or refund beyond what is left), conflict (idempotency key reused
// with other arguments), internal (storage).
func (t *Tool) Invoke(ctx context.Context, inv plugins.Invocation) (json.RawMessage, error) {
	var a Args
	if err := plugins.DecodeArgs(inv, &a); err != nil {
		return nil, err
	}
	switch a.Op {
	case "get_intent":
		in, err := t.ledger.GetIntent(ctx, t.ledger.db, a.IntentID)
		if err != nil {
			return nil, err
		}
		if in.Member != inv.Caller.Member {
			return nil, plugins.Errorf(plugins.CodeNotFound, "no payment intent %q", a.IntentID)
		}
		return json.Marshal(Result{Intent: in})
	case "balances":
		bs, err := t.ledger.Balances(ctx)
		if err != nil {
			return nil, err
		}
		return json.Marshal(Result{Balances: bs})
	case "create_intent", "capture", "refund":
	default:
		return nil, plugins.Errorf(plugins.CodeInvalidArgument, "op %q must be create_intent, capture, refund, get_intent or balances", a.Op)
	}
	if inv.IdempotencyKey == "" {
		return nil, plugins.Errorf(plugins.CodeInvalidArgument, "op %s moves money and needs an idempotency key", a.Op)
	}
	if a.Amount != nil && (*a.Amount < 1 || *a.Amount > maxAmount) {
		return nil, plugins.Errorf(plugins.CodeInvalidArgument, "amount %d must be 1..%d minor units", *a.Amount, int64(maxAmount))
	}
	canon, _ := json.Marshal(a) // struct order: a canonical form of the arguments
	h := sha256.Sum256(canon)
	reqHash := hex.EncodeToString(h[:])
	// The provider gets a key unique to (member, caller's key), so two
	// members' keys never collide at the provider.
	pk := sha256.Sum256([]byte(inv.Caller.Member + "\x00" + inv.IdempotencyKey))
	provKey := hex.EncodeToString(pk[:16])
	return t.ledger.Idempotent(ctx, inv.Caller.Member, inv.IdempotencyKey, reqHash, func(tx *sql.Tx) (any, error) {
		switch a.Op {
		case "create_intent":
			return t.createIntent(ctx, tx, inv.Caller.Member, a, provKey)
		default:
			return t.move(ctx, tx, inv.Caller.Member, a, provKey)
		}
	})
}

func (t *Tool) createIntent(ctx context.Context, tx *sql.Tx, member string, a Args, key string) (any, error) {
	if a.Amount == nil {
		return nil, plugins.Errorf(plugins.CodeInvalidArgument, "create_intent needs amount")
	}
	if _, ok := exponents[a.Currency]; !ok {
		return nil, plugins.Errorf(plugins.CodeInvalidArgument, "currency %q is not a supported ISO 4217 code", a.Currency)
	}
	if !customerRE.MatchString(a.Customer) {
		return nil, plugins.Errorf(plugins.CodeInvalidArgument, "customer %q must match %s", a.Customer, customerRE)
	}
	if a.IntentID != "" {
		return nil, plugins.Errorf(plugins.CodeInvalidArgument, "create_intent takes no intent_id")
	}
	ref, err := t.provider.Authorize(ctx, a.Customer, *a.Amount, a.Currency, key)
	if err != nil {
		return nil, plugins.Errorf(plugins.CodeFailedPrecondition, "provider %s refused the authorisation: %v", t.provider.Name(), err)
	}
	var id [12]byte
	if _, err := rand.Read(id[:]); err != nil {
		return nil, internal(err)
	}
	in := &Intent{ID: "pi_" + hex.EncodeToString(id[:]), Member: member, Customer: a.Customer, Amount: *a.Amount,
		Currency: a.Currency, Description: a.Description, Provider: t.provider.Name(), ProviderRef: ref}
	if err := t.ledger.InsertIntent(ctx, tx, in); err != nil {
		return nil, err
	}
	return Result{Intent: in}, nil
}

// move captures or refunds.
func (t *Tool) move(ctx context.Context, tx *sql.Tx, member string, a Args, key string) (any, error) {
	if a.Currency != "" || a.Customer != "" || a.Description != "" {
		return nil, plugins.Errorf(plugins.CodeInvalidArgument, "%s takes only intent_id and amount", a.Op)
	}
	in, err := t.ledger.GetIntent(ctx, tx, a.IntentID)
	if err != nil {
		return nil, err
	}
	if in.Member != member {
		return nil, plugins.Errorf(plugins.CodeNotFound, "no payment intent %q", a.IntentID)
	}
	left := in.Amount - in.Captured
	if a.Op == "refund" {
		left = in.Captured - in.Refunded
	}
	amount := left
	if a.Amount != nil {
		amount = *a.Amount
	}
	if amount < 1 || amount > left {
		return nil, plugins.Errorf(plugins.CodeFailedPrecondition, "%s of %d %s: %d left on intent %s", a.Op, amount, in.Currency, left, in.ID)
	}
	var ref string
	if a.Op == "capture" {
		ref, err = t.provider.Capture(ctx, in.ProviderRef, amount, in.Currency, key)
	} else {
		ref, err = t.provider.Refund(ctx, in.ProviderRef, amount, in.Currency, key)
	}
	if err != nil {
		return nil, plugins.Errorf(plugins.CodeFailedPrecondition, "provider %s refused the %s: %v", t.provider.Name(), a.Op, err)
	}
	txn, err := t.ledger.Post(ctx, tx, in, a.Op, amount, ref)
	if err != nil {
		return nil, err
	}
	return Result{Intent: in, Transaction: txn}, nil
}

var _ plugins.Tool = (*Tool)(nil)
