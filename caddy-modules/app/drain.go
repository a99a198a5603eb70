package app

import (
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"
)

// On a config reload Caddy starts the new configuration, stops the old
// one's HTTP servers without waiting for their requests (only an exiting
// process waits for the grace period), then cleans up the old modules. The
// old app's requests still in flight — a stream from the T0 engine, a tool
// loop, an upstream call — need its engine, tools, upstream connections
// and registry until they end, so Cleanup closes those once this app's
// handlers have no request left (drainLimit at most), and at once when the
// process exits or nothing is in flight.

// drainLimit bounds how long a replaced configuration keeps its engine and
// connections open for its requests in flight.
const drainLimit = 5 * time.Minute

// inflight counts the requests this app's handlers are serving.
type inflight struct {
	mu   sync.Mutex
	n    int
	idle chan struct{} // closed when n drops to 0 while a drain waits
}

// Serving marks a request in flight in this app (molly_route, molly_serve)
// until the returned function is called.
func (a *App) Serving() (done func()) {
	f := a.inflight
	if f == nil { // not provisioned: nothing to drain
		return func() {}
	}
	f.mu.Lock()
	f.n++
	f.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			f.mu.Lock()
			f.n--
			if f.n == 0 && f.idle != nil {
				close(f.idle)
				f.idle = nil
			}
			f.mu.Unlock()
		})
	}
}

// InFlight is the number of requests this app's handlers are serving.
func (a *App) InFlight() int {
	if a.inflight == nil {
		return 0
	}
	a.inflight.mu.Lock()
	defer a.inflight.mu.Unlock()
	return a.inflight.n
}

// drained returns nil when no request is in flight, else a channel closed
// when the last one ends, and the count now.
func (a *App) drained() (<-chan struct{}, int) {
	f := a.inflight
	if f == nil {
		return nil, 0
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.n == 0 {
		return nil, 0
	}
	if f.idle == nil {
		f.idle = make(chan struct{})
	}
	return f.idle, f.n
}

// afterDrain runs release now when the process exits or no request is in
// flight, else once the requests in flight have ended (drainLimit at most),
// in the background.
func (a *App) afterDrain(release func()) {
	idle, n := a.drained()
	if idle == nil || caddy.Exiting() {
		release()
		return
	}
	a.logger.Info("the replaced configuration keeps its engine and connections for its requests in flight",
		zap.Int("requests", n), zap.Duration("at_most", drainLimit))
	go func() {
		t := time.NewTimer(drainLimit)
		defer t.Stop()
		select {
		case <-idle:
		case <-t.C:
			a.logger.Warn("requests of the replaced configuration still running after the drain limit: closing its engine", zap.Int("requests", a.InFlight()))
		}
		release()
	}()
}
