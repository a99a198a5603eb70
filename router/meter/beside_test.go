package meter

import (
	"context"
	"testing"

	"github.com/molly-gateway/molly/router/route"
)

// blockingLedger holds each Record until release is closed.
type blockingLedger struct {
	ledger
	entered chan struct{}
	release chan struct{}
}

func (l *blockingLedger) Record(ctx context.Context, u Usage) error {
	close(l.entered)
	<-l.release
	return l.ledger.Record(ctx, u)
}

// panicLedger panics in Record.
type panicLedger struct{}

func (panicLedger) Record(context.Context, Usage) error { panic("ledger bug") }

func TestBodyBesideRecordsWhatBodyRecords(t *testing.T) {
	body := []byte(`{"choices":[{"message":{"content":"hi"}}],"usage":{"prompt_tokens":5,"completion_tokens":7}}`)
	l := &blockingLedger{entered: make(chan struct{}), release: make(chan struct{})}
	m := New(context.Background(), Options{Ledger: l, Target: &route.Target{Name: "t", PriceIn: 1, PriceOut: 2},
		Base: Usage{DecisionID: "d", Model: "m", Target: "t", Tier: "T1"}})
	m.BodyBeside(body)
	// Final is set before the ledger's Record returns (it has not: it waits).
	if u := m.Final(); u == nil || u.PromptTokens != 5 || u.CompletionTokens != 7 || u.CostUSD != 19e-6 {
		t.Fatalf("final %+v before the append", u)
	}
	<-l.entered
	settled := make(chan struct{})
	go func() {
		m.Settle()
		close(settled)
	}()
	close(l.release)
	<-settled
	if len(l.got) != 1 || l.got[0].PromptTokens != 5 || l.got[0].CompletionTokens != 7 || l.got[0].CostUSD != 19e-6 || l.got[0].DecisionID != "d" {
		t.Fatalf("ledger got %+v once settled", l.got)
	}
	m.Settle() // settled already: returns at once
}

func TestSettleRaisesTheLedgersPanic(t *testing.T) {
	m := New(context.Background(), Options{Ledger: panicLedger{}, Target: &route.Target{Name: "t"}})
	m.BodyBeside([]byte(`{"choices":[],"usage":{"prompt_tokens":1,"completion_tokens":1}}`))
	defer func() {
		if v := recover(); v != "ledger bug" {
			t.Fatalf("recovered %v, want the ledger's panic", v)
		}
	}()
	m.Settle()
	t.Fatal("Settle returned")
}
