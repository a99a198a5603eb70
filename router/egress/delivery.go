package egress

import (
	"context"
	"net"
	"net/http/httptrace"
	"sync"
	"sync/atomic"

	"github.com/molly-gateway/molly/router/route"
)

// wireConn is a connection to an upstream that remembers whether a write
// on it failed. Every byte the HTTP/1 transport sends goes through Write
// (wireConn has no ReadFrom, so io.Copy cannot bypass it), so a failed
// write is seen here even when the transport reports nothing of it.
type wireConn struct {
	net.Conn
	failed atomic.Bool
}

func (c *wireConn) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	if err != nil {
		c.failed.Store(true)
	}
	return n, err
}

// dialWire dials with d and wraps the connection in a wireConn.
func dialWire(d *net.Dialer) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := d.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return &wireConn{Conn: c}, nil
	}
}

// delivery follows one request through its client trace.
type delivery struct {
	mu    sync.Mutex
	wrote bool      // WroteRequest reported no error
	conn  *wireConn // the plain HTTP/1 connection it went on; nil for TLS or HTTP/2
}

// Delivery returns ctx with an HTTP client trace and a function that
// reports whether the request sent under it with Send reached the upstream
// in full: every byte of it was handed to the connection's socket without
// error, so the upstream may be processing the prompt (and bills it even if
// the caller goes away). Call the function once Send returned an error (an
// answer in hand says more than it can); it is safe from any goroutine.
// The in-process engine has no wire: once Send is called, it has the
// request.
//
// net/http's WroteRequest alone does not say this for HTTP/1: it fires
// once the request is written into the transport's write buffer (4 KiB),
// before the transport flushes that buffer to the socket (persistConn's
// writeLoop), so a context cancelled in between closes the connection and
// the flush fails with nothing sent. On a plain connection the flush is a
// write through wireConn, which records the failure. Over TLS the failed
// flush stops at the tls.Conn (closed) and cannot be told from a sent one,
// so there WroteRequest is all there is; HTTP/2 reports WroteRequest after
// its flush, so it is exact.
func (d *Dispatch) Delivery(ctx context.Context) (context.Context, func() bool) {
	if d.target.Kind == route.KindEngine {
		return ctx, func() bool { return true }
	}
	dl := &delivery{}
	ctx = httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{
		GotConn: func(i httptrace.GotConnInfo) {
			wc, _ := i.Conn.(*wireConn) // nil for a *tls.Conn (HTTPS, HTTP/2): not followed
			dl.mu.Lock()
			dl.conn, dl.wrote = wc, false // a retry on another connection starts over
			dl.mu.Unlock()
		},
		WroteRequest: func(i httptrace.WroteRequestInfo) {
			dl.mu.Lock()
			dl.wrote = i.Err == nil
			dl.mu.Unlock()
		},
	})
	return ctx, dl.reached
}

// reached: the request was written without error, and (on a plain
// connection) no write on its connection failed, the buffer's flush
// included. Send returns an error only after the transport's write loop
// is done with the request (persistConn.mapRoundTripError waits for it), so
// the flush's outcome is known by then.
func (dl *delivery) reached() bool {
	dl.mu.Lock()
	defer dl.mu.Unlock()
	return dl.wrote && (dl.conn == nil || !dl.conn.failed.Load())
}
