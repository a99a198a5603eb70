package egress

import (
	"context"
	"net"
	"net/http"
	"net/http/httptrace"
	"strings"
	"testing"

	"github.com/molly-gateway/molly/internal/upstreamtest"
	"github.com/molly-gateway/molly/router/openai"
	"github.com/molly-gateway/molly/router/route"
)

// TestDeliveryReportsWhatReachedTheUpstream: Delivery says a request
// reached the upstream exactly when the upstream received it — also when
// the connection is closed after the request was written into the
// transport's buffer and before that buffer was flushed (what a cancelled
// context does; net/http's WroteRequest has reported success by then).
func TestDeliveryReportsWhatReachedTheUpstream(t *testing.T) {
	lan := upstreamtest.Start("lan")
	t.Cleanup(lan.Close)
	tg := &route.Target{Name: "lan", Tier: "T1", Endpoint: lan.URL(), Models: []string{"m"}}
	e := newEgress(t, []*route.Target{tg}, nil)
	dispatch := func(t *testing.T, prompt string) *Dispatch {
		t.Helper()
		a := annotate(t, nil, openai.EndpointChat, chatBody(prompt))
		disp, err := e.NewDispatch(decided(t, a, allowTiers(allTiers, nil)), a, route.Candidate{Target: tg, Model: "m"})
		if err != nil {
			t.Fatal(err)
		}
		return disp
	}
	received := func(prompt string) int {
		n := 0
		for _, b := range lan.Received() {
			if strings.Contains(string(b), prompt) {
				n++
			}
		}
		return n
	}

	t.Run("answered", func(t *testing.T) {
		disp := dispatch(t, "answered")
		ctx, reached := disp.Delivery(context.Background())
		resp, err := disp.Send(ctx, http.Header{})
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if !reached() || received("answered") != 1 {
			t.Fatalf("reached %v, the upstream received it %d times", reached(), received("answered"))
		}
	})

	t.Run("connection closed between the buffered write and its flush", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		disp := dispatch(t, "never flushed")
		ctx, reached := disp.Delivery(ctx)
		var conn net.Conn
		ctx = httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{
			GotConn: func(i httptrace.GotConnInfo) { conn = i.Conn },
			WroteRequest: func(i httptrace.WroteRequestInfo) {
				if i.Err != nil {
					t.Errorf("writing into the buffer failed: %v", i.Err)
				}
				cancel()
				conn.Close() // what the transport does on the cancel, before its write loop flushes
			},
		})
		if resp, err := disp.Send(ctx, http.Header{}); err == nil {
			resp.Body.Close()
			t.Fatal("an answer over a connection closed before the request was flushed")
		}
		if reached() {
			t.Fatal("reached, though nothing was flushed to the socket")
		}
		// The connection is closed and nothing was written on it: the
		// upstream cannot get it later.
		if n := received("never flushed"); n != 0 {
			t.Fatalf("the upstream received it %d times", n)
		}
	})

	t.Run("client gone after the upstream received it", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		returned := make(chan struct{})
		slow := upstreamtest.Start("slow")
		slow.Answer = func(prompt string) string {
			cancel()   // the body was read in full: the caller leaves now
			<-returned // and Send returns before any answer
			return prompt
		}
		t.Cleanup(slow.Close)
		tg := &route.Target{Name: "slow", Tier: "T1", Endpoint: slow.URL(), Models: []string{"m"}}
		e := newEgress(t, []*route.Target{tg}, nil)
		a := annotate(t, nil, openai.EndpointChat, chatBody("received, then left"))
		disp, err := e.NewDispatch(decided(t, a, allowTiers(allTiers, nil)), a, route.Candidate{Target: tg, Model: "m"})
		if err != nil {
			t.Fatal(err)
		}
		ctx, reached := disp.Delivery(ctx)
		resp, err := disp.Send(ctx, http.Header{})
		close(returned)
		if err == nil {
			resp.Body.Close()
			t.Fatal("an answer after the caller left")
		}
		if !reached() || !slow.Contains("received, then left") {
			t.Fatalf("reached %v, the upstream received %d requests", reached(), slow.Count())
		}
	})
}
