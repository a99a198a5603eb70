package plugins_test

import (
	"encoding/json"
	"syscall"
	"testing"
	"time"

	"github.com/molly-gateway/molly/plugins"
)

type intent struct {
	ID       string `json:"id"`
	Amount   int64  `json:"amount"`
	Currency string `json:"currency"`
	Exponent int    `json:"exponent"`
	Captured int64  `json:"captured"`
	Refunded int64  `json:"refunded"`
	Status   string `json:"status"`
}

type paymentResult struct {
	Intent      *intent `json:"intent"`
	Transaction *struct {
		ID      int64 `json:"id"`
		Entries []struct {
			Account string `json:"account"`
			Amount  int64  `json:"amount"`
		} `json:"entries"`
	} `json:"transaction"`
	Balances []struct {
		Account  string `json:"account"`
		Currency string `json:"currency"`
		Balance  int64  `json:"balance"`
	} `json:"balances"`
}

func paymentsManager(t *testing.T) *plugins.Manager {
	return newManager(t, plugins.Config{Name: "payments", Path: paymentsBin, SHA256: paymentsSum,
		Env: map[string]string{"MOLLY_PAYMENTS_DB": t.TempDir() + "/ledger.db"}})
}

func pay(t *testing.T, m *plugins.Manager, key string, args map[string]any) (paymentResult, json.RawMessage, error) {
	t.Helper()
	raw, err := invoke(t, m, "payments", key, args)
	var r paymentResult
	if err == nil {
		if jerr := json.Unmarshal(raw, &r); jerr != nil {
			t.Fatalf("result %s: %v", raw, jerr)
		}
	}
	return r, raw, err
}

// balances returns account → balance in minor units for one currency.
func balances(t *testing.T, m *plugins.Manager, currency string) map[string]int64 {
	t.Helper()
	r, _, err := pay(t, m, "", map[string]any{"op": "balances"})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int64{}
	var sum int64
	for _, b := range r.Balances {
		if b.Currency == currency {
			out[b.Account] = b.Balance
			sum += b.Balance
		}
	}
	if sum != 0 {
		t.Errorf("the %s balances sum to %d, want 0 (double entry)", currency, sum)
	}
	return out
}

func TestAPaymentIsCapturedAndRefundedInTheLedger(t *testing.T) {
	m := paymentsManager(t)
	r, _, err := pay(t, m, "k-create", map[string]any{"op": "create_intent", "amount": 2500, "currency": "EUR", "customer": "cust_1"})
	if err != nil {
		t.Fatal(err)
	}
	id := r.Intent.ID
	if r.Intent.Amount != 2500 || r.Intent.Currency != "EUR" || r.Intent.Exponent != 2 || r.Intent.Status != "requires_capture" {
		t.Fatalf("created %+v, want 2500 EUR (exponent 2) requiring capture", *r.Intent)
	}
	steps := []struct {
		name               string
		key                string
		args               map[string]any
		captured, refunded int64
		status             string
		customer, merchant int64 // balances after the step
		wantCode           string
	}{
		{"a partial capture moves 1000 from the customer to the merchant", "k-cap-1",
			map[string]any{"op": "capture", "intent_id": id, "amount": 1000}, 1000, 0, "partially_captured", -1000, 1000, ""},
		{"a capture without amount takes the remaining 1500", "k-cap-2",
			map[string]any{"op": "capture", "intent_id": id}, 2500, 0, "captured", -2500, 2500, ""},
		{"capturing beyond the intent is refused and books nothing", "k-cap-3",
			map[string]any{"op": "capture", "intent_id": id, "amount": 1}, 2500, 0, "captured", -2500, 2500, plugins.CodeFailedPrecondition},
		{"a partial refund moves 500 back to the customer", "k-ref-1",
			map[string]any{"op": "refund", "intent_id": id, "amount": 500}, 2500, 500, "partially_refunded", -2000, 2000, ""},
		{"refunding more than is left is refused", "k-ref-2",
			map[string]any{"op": "refund", "intent_id": id, "amount": 2001}, 2500, 500, "partially_refunded", -2000, 2000, plugins.CodeFailedPrecondition},
		{"a refund without amount returns the rest", "k-ref-3",
			map[string]any{"op": "refund", "intent_id": id}, 2500, 2500, "refunded", 0, 0, ""},
	}
	for _, s := range steps {
		t.Run(s.name, func(t *testing.T) {
			r, _, err := pay(t, m, s.key, s.args)
			if s.wantCode != "" {
				if !isCode(err, s.wantCode) {
					t.Fatalf("got %v, want a %s tool error", err, s.wantCode)
				}
			} else if err != nil {
				t.Fatal(err)
			} else if r.Transaction == nil || len(r.Transaction.Entries) != 2 || r.Transaction.Entries[0].Amount+r.Transaction.Entries[1].Amount != 0 {
				t.Errorf("transaction %+v: want two entries summing to zero", r.Transaction)
			}
			g, _, err := pay(t, m, "", map[string]any{"op": "get_intent", "intent_id": id})
			if err != nil {
				t.Fatal(err)
			}
			if g.Intent.Captured != s.captured || g.Intent.Refunded != s.refunded || g.Intent.Status != s.status {
				t.Errorf("intent captured %d refunded %d %s, want %d %d %s", g.Intent.Captured, g.Intent.Refunded, g.Intent.Status, s.captured, s.refunded, s.status)
			}
			b := balances(t, m, "EUR")
			if b["customer:cust_1"] != s.customer || b["merchant"] != s.merchant {
				t.Errorf("balances %v, want customer:cust_1 %d and merchant %d", b, s.customer, s.merchant)
			}
		})
	}
}

func TestARetriedPaymentWithTheSameKeyChargesOnce(t *testing.T) {
	m := paymentsManager(t)
	r, _, err := pay(t, m, "create-1", map[string]any{"op": "create_intent", "amount": 1999, "currency": "USD", "customer": "bob"})
	if err != nil {
		t.Fatal(err)
	}
	capture := map[string]any{"op": "capture", "intent_id": r.Intent.ID}
	_, first, err := pay(t, m, "capture-1", capture)
	if err != nil {
		t.Fatal(err)
	}
	// A retry straight away, and one after the plugin crashed and restarted
	// (the idempotency record is on disk, not in the process).
	_, again, err := pay(t, m, "capture-1", capture)
	if err != nil || string(again) != string(first) {
		t.Fatalf("the retry returned %s, %v; want the first result %s", again, err, first)
	}
	old := m.PIDs()["payments"]
	if err := syscall.Kill(old, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	var afterCrash []byte
	deadline := time.Now().Add(5 * time.Second)
	for {
		if _, afterCrash, err = pay(t, m, "capture-1", capture); err == nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err != nil || string(afterCrash) != string(first) {
		t.Fatalf("the retry after a restart returned %s, %v; want the first result %s", afterCrash, err, first)
	}
	if pid := m.PIDs()["payments"]; pid == old {
		t.Errorf("payments still runs as pid %d, want a restarted process", pid)
	}
	b := balances(t, m, "USD")
	if b["customer:bob"] != -1999 || b["merchant"] != 1999 {
		t.Errorf("balances %v after three tries of one capture, want customer:bob -1999 and merchant 1999", b)
	}
	// The creation retried with the same key names the same intent.
	r2, _, err := pay(t, m, "create-1", map[string]any{"op": "create_intent", "amount": 1999, "currency": "USD", "customer": "bob"})
	if err != nil || r2.Intent.ID != r.Intent.ID {
		t.Errorf("the retried creation gave %v, %v; want intent %s", r2.Intent, err, r.Intent.ID)
	}
}

func TestPaymentsRefusesBadCalls(t *testing.T) {
	m := paymentsManager(t)
	r, _, err := pay(t, m, "c", map[string]any{"op": "create_intent", "amount": 100, "currency": "JPY", "customer": "kei"})
	if err != nil {
		t.Fatal(err)
	}
	if r.Intent.Exponent != 0 {
		t.Errorf("JPY exponent %d, want 0", r.Intent.Exponent)
	}
	cases := []struct {
		name string
		key  string
		args map[string]any
		code string
	}{
		{"a call that moves money without an idempotency key is refused", "", map[string]any{"op": "capture", "intent_id": r.Intent.ID}, plugins.CodeInvalidArgument},
		{"a key reused with other arguments is a conflict", "c", map[string]any{"op": "create_intent", "amount": 101, "currency": "JPY", "customer": "kei"}, plugins.CodeConflict},
		{"an unknown currency is refused", "c2", map[string]any{"op": "create_intent", "amount": 100, "currency": "XYZ", "customer": "kei"}, plugins.CodeInvalidArgument},
		{"a fractional amount is refused", "c3", map[string]any{"op": "create_intent", "amount": 1.5, "currency": "USD", "customer": "kei"}, plugins.CodeInvalidArgument},
		{"a zero amount is refused", "c4", map[string]any{"op": "create_intent", "amount": 0, "currency": "USD", "customer": "kei"}, plugins.CodeInvalidArgument},
		{"an unknown argument is refused", "c5", map[string]any{"op": "create_intent", "amount": 1, "currency": "USD", "customer": "kei", "tip": 5}, plugins.CodeInvalidArgument},
		{"an unknown intent is not found", "c6", map[string]any{"op": "capture", "intent_id": "pi_000000000000000000000000"}, plugins.CodeNotFound},
		{"an unknown op is refused", "c7", map[string]any{"op": "transfer"}, plugins.CodeInvalidArgument},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if _, raw, err := pay(t, m, c.key, c.args); !isCode(err, c.code) {
				t.Errorf("got %s, %v; want a %s tool error", raw, err, c.code)
			}
		})
	}
	if b := balances(t, m, "JPY"); len(b) != 0 {
		t.Errorf("balances %v after refused calls only, want none", b)
	}
}
