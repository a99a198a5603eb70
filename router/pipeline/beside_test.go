package pipeline

import (
	"context"
	"runtime"
	"testing"

	"github.com/molly-gateway/molly/internal/upstreamtest"
	"github.com/molly-gateway/molly/router/identity"
	"github.com/molly-gateway/molly/router/meter"
	"github.com/molly-gateway/molly/router/route"
)

// gateLedger holds each Record until the test lets it through.
type gateLedger struct {
	memLedger
	entered chan struct{}
	release chan struct{}
}

func (l *gateLedger) Record(ctx context.Context, u meter.Usage) error {
	l.entered <- struct{}{}
	<-l.release
	return l.memLedger.Record(ctx, u)
}

// TestTheAnswerLeavesOnlyOnceItsUsageIsRecorded: with a core spare the
// usage of a whole answer is appended beside the answer's delivery
// (meter.BodyBeside); the client still gets nothing until the ledger's
// Record returned, and then the record is there: every time.
func TestTheAnswerLeavesOnlyOnceItsUsageIsRecorded(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(2))
	up := upstreamtest.Start("lan")
	t.Cleanup(up.Close)
	ledger := &gateLedger{entered: make(chan struct{}), release: make(chan struct{})}
	targets := []*route.Target{{Name: "lan", Tier: "T1", Endpoint: up.URL(), Models: []string{"m"}}}
	gw, _ := startGateway(t, setup{targets: targets, id: &identity.Identity{Member: "alice", Ledger: ledger}})
	for i := range 20 {
		answered := make(chan reply, 1)
		go func() { answered <- post(t, gw.URL+"/v1/chat/completions", chatBody("hello")) }()
		<-ledger.entered
		select {
		case r := <-answered:
			t.Fatalf("request %d answered (%d) while its usage was not recorded", i, r.status)
		default:
		}
		ledger.release <- struct{}{}
		if r := <-answered; r.status != 200 {
			t.Fatalf("request %d: status %d: %s", i, r.status, r.body)
		}
		if got := ledger.take(); len(got) != 1 || got[0].Target != "lan" {
			t.Fatalf("request %d: recorded %+v once answered, want its one record", i, got)
		}
	}
}
