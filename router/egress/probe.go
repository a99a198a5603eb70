package egress

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/molly-gateway/molly/router/route"
)

// ProbeTimeout bounds one health probe.
const ProbeTimeout = 2 * time.Second

// ProbeTTL is how long a probe's outcome is reused, so that readiness
// checks arriving often do not turn into a stream of upstream calls.
const ProbeTTL = 5 * time.Second

// TargetHealth is one target's probe outcome.
type TargetHealth struct {
	Target string `json:"target"`
	Tier   string `json:"tier"`
	OK     bool   `json:"ok"`
	// Error says why the target is not healthy ("" when it is).
	Error string `json:"error,omitempty"`
	// Checked is when the probe ran.
	Checked time.Time `json:"checked"`
}

// probes caches TargetHealth by target name.
type probes struct {
	mu   sync.Mutex
	last map[string]TargetHealth
}

// Health probes every target of the catalogue concurrently — GET
// <endpoint>/models, carrying no request content, with the target's API
// key; the engine through its in-process handler — and reports each,
// reusing an outcome younger than ProbeTTL. A target is healthy when it
// answers with a status below 500 other than 401 and 403 (a server
// without a models listing answers 404 and is still up; one that refuses
// Molly's key is not usable). A target without its API key
// (route.Target.MissingKey) is not probed: it is reported unhealthy with
// that reason.
func (e *Egress) Health(ctx context.Context, cat *route.Catalogue) []TargetHealth {
	ts := cat.Targets()
	out := make([]TargetHealth, len(ts))
	var wg sync.WaitGroup
	now := time.Now()
	for i, t := range ts {
		e.probes.mu.Lock()
		h, ok := e.probes.last[t.Name]
		e.probes.mu.Unlock()
		if ok && now.Sub(h.Checked) < ProbeTTL {
			out[i] = h
			continue
		}
		wg.Go(func() {
			h := TargetHealth{Target: t.Name, Tier: t.Tier, Checked: time.Now()}
			if err := e.probe(ctx, t); err != nil {
				h.Error = err.Error()
			} else {
				h.OK = true
			}
			e.probes.mu.Lock()
			if e.probes.last == nil {
				e.probes.last = map[string]TargetHealth{}
			}
			e.probes.last[t.Name] = h
			e.probes.mu.Unlock()
			out[i] = h
		})
	}
	wg.Wait()
	return out
}

func (e *Egress) probe(ctx context.Context, t *route.Target) error {
	u, ok := e.clients[t.Name]
	if !ok {
		return fmt.Errorf("no client")
	}
	if why := t.MissingKey(); why != "" {
		return errors.New(why)
	}
	ctx, cancel := context.WithTimeout(ctx, ProbeTimeout)
	defer cancel()
	target := *u.base
	target.Path += "/models"
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, target.String(), nil)
	if err != nil {
		return err
	}
	if u.apiKey != "" {
		req.Header.Set("Authorization", "Bearer "+u.apiKey)
	}
	resp, err := u.client.Do(req)
	if err != nil {
		return errors.New(upstreamErr(err))
	}
	resp.Body.Close()
	if resp.StatusCode >= 500 || resp.StatusCode == http.StatusUnauthorized || resp.StatusCode == http.StatusForbidden {
		return fmt.Errorf("HTTP %s", resp.Status)
	}
	return nil
}

// upstreamErr is the cause of a failed call without its URL ("connection
// refused", "timed out").
func upstreamErr(err error) string {
	var ne interface{ Timeout() bool }
	if errors.As(err, &ne) && ne.Timeout() {
		return "timed out"
	}
	s := err.Error()
	if i := strings.LastIndex(s, ": "); i >= 0 {
		s = s[i+2:]
	}
	return s
}
