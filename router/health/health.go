// Package health is per-target outlier detection and circuit breaking,
// after Envoy's outlier detection (envoy.config.cluster.v3.OutlierDetection,
// https://www.envoyproxy.io/docs/envoy/latest/intro/arch_overview/upstream/outlier):
// a target is ejected — removed from every route plan — after
// consecutive_5xx failed attempts in a row, when its failure percentage
// over an interval reaches failure_percentage_threshold, or when an attempt
// waits longer than latency_threshold for its answer. It stays out for
// base_ejection_time × the number of times it was ejected (capped at
// max_ejection_time); then it is half-open: one attempt at a time (the
// probe, as in the circuit breaker of Nygard's Release It!, 2007) decides
// whether it closes (success) or is ejected again (failure). At most
// max_ejection_percent of the targets are ejected at once, and always at
// least one may be, as in Envoy.
//
// The pipeline feeds every attempt's outcome (Begin, Attempt.End) and route
// ranking asks Admit; a Tracker is safe for concurrent use. Nothing here
// imports Caddy.
package health

import (
	"encoding/json"
	"fmt"
	"math"
	"sort"
	"strconv"
	"sync"
	"time"
)

// Defaults of Config, Envoy's where Envoy has the knob.
const (
	DefaultConsecutive5xx                 = 5
	DefaultInterval                       = 10 * time.Second
	DefaultBaseEjectionTime               = 30 * time.Second
	DefaultMaxEjectionTime                = 300 * time.Second
	DefaultMaxEjectionPercent             = 10
	DefaultFailurePercentageThreshold     = 85
	DefaultFailurePercentageRequestVolume = 20
)

// Duration is a time.Duration that reads and writes JSON as a Go duration
// string ("10s"), and also reads integer nanoseconds.
type Duration time.Duration

// MarshalJSON writes d as a duration string.
func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(time.Duration(d).String()) }

// UnmarshalJSON reads "10s" or an integer of nanoseconds.
func (d *Duration) UnmarshalJSON(b []byte) error {
	if len(b) > 0 && b[0] == '"' {
		var s string
		if err := json.Unmarshal(b, &s); err != nil {
			return err
		}
		v, err := time.ParseDuration(s)
		if err != nil {
			return err
		}
		*d = Duration(v)
		return nil
	}
	n, err := strconv.ParseInt(string(b), 10, 64)
	if err != nil {
		return fmt.Errorf("duration %s: want a string such as \"10s\" or nanoseconds", b)
	}
	*d = Duration(n)
	return nil
}

// Config is one target's outlier detection; zero fields take the defaults
// (Merge fills them from another Config first). Names follow Envoy's.
type Config struct {
	// Disabled turns detection off for the target: it is never ejected.
	Disabled bool `json:"disabled,omitempty"`
	// Consecutive5xx ejects after this many failed attempts in a row: an
	// HTTP 5xx, or a failure of local origin (connect error, timeout, an
	// answer that broke off, was not JSON or not a stream), as Envoy counts
	// them when it does not split local-origin errors. Default 5.
	Consecutive5xx int `json:"consecutive_5xx,omitempty"`
	// Interval is the window of the failure percentage and of the decay of
	// the ejection multiplier. Default 10s.
	Interval Duration `json:"interval,omitempty"`
	// BaseEjectionTime is how long the first ejection lasts; the n-th lasts
	// n times as long, up to MaxEjectionTime. Defaults 30s and 300s.
	BaseEjectionTime Duration `json:"base_ejection_time,omitempty"`
	MaxEjectionTime  Duration `json:"max_ejection_time,omitempty"`
	// MaxEjectionPercent bounds the share of all targets ejected at once (at
	// least one target may always be). Default 10.
	MaxEjectionPercent int `json:"max_ejection_percent,omitempty"`
	// FailurePercentageThreshold ejects a target whose attempts in the
	// current interval failed at least this often (percent), once it had
	// FailurePercentageRequestVolume attempts in it. Defaults 85 and 20.
	FailurePercentageThreshold     int `json:"failure_percentage_threshold,omitempty"`
	FailurePercentageRequestVolume int `json:"failure_percentage_request_volume,omitempty"`
	// LatencyThreshold, when set, counts an attempt still without its
	// answer (headers, or a stream's first content event) after this long
	// as a failure at that moment, so a hung upstream is ejected while the
	// first attempts are still waiting for their timeout. Default 0: off.
	LatencyThreshold Duration `json:"latency_threshold,omitempty"`
}

// Merge returns c with its zero fields taken from base.
func (c Config) Merge(base Config) Config {
	c.Disabled = c.Disabled || base.Disabled
	pick := func(v, b int) int {
		if v == 0 {
			return b
		}
		return v
	}
	pickD := func(v, b Duration) Duration {
		if v == 0 {
			return b
		}
		return v
	}
	c.Consecutive5xx = pick(c.Consecutive5xx, base.Consecutive5xx)
	c.Interval = pickD(c.Interval, base.Interval)
	c.BaseEjectionTime = pickD(c.BaseEjectionTime, base.BaseEjectionTime)
	c.MaxEjectionTime = pickD(c.MaxEjectionTime, base.MaxEjectionTime)
	c.MaxEjectionPercent = pick(c.MaxEjectionPercent, base.MaxEjectionPercent)
	c.FailurePercentageThreshold = pick(c.FailurePercentageThreshold, base.FailurePercentageThreshold)
	c.FailurePercentageRequestVolume = pick(c.FailurePercentageRequestVolume, base.FailurePercentageRequestVolume)
	c.LatencyThreshold = pickD(c.LatencyThreshold, base.LatencyThreshold)
	return c
}

// withDefaults fills the zero fields with the package defaults.
func (c Config) withDefaults() Config {
	return c.Merge(Config{Consecutive5xx: DefaultConsecutive5xx, Interval: Duration(DefaultInterval),
		BaseEjectionTime: Duration(DefaultBaseEjectionTime), MaxEjectionTime: Duration(DefaultMaxEjectionTime),
		MaxEjectionPercent: DefaultMaxEjectionPercent, FailurePercentageThreshold: DefaultFailurePercentageThreshold,
		FailurePercentageRequestVolume: DefaultFailurePercentageRequestVolume})
}

// Validate rejects negative values and percentages over 100; errors name the field.
func (c Config) Validate() error {
	for _, f := range []struct {
		name string
		v    int64
	}{{"consecutive_5xx", int64(c.Consecutive5xx)}, {"interval", int64(c.Interval)}, {"base_ejection_time", int64(c.BaseEjectionTime)},
		{"max_ejection_time", int64(c.MaxEjectionTime)}, {"max_ejection_percent", int64(c.MaxEjectionPercent)},
		{"failure_percentage_threshold", int64(c.FailurePercentageThreshold)},
		{"failure_percentage_request_volume", int64(c.FailurePercentageRequestVolume)}, {"latency_threshold", int64(c.LatencyThreshold)}} {
		if f.v < 0 {
			return fmt.Errorf("outlier_detection %s must not be negative", f.name)
		}
	}
	if c.MaxEjectionPercent > 100 || c.FailurePercentageThreshold > 100 {
		return fmt.Errorf("outlier_detection max_ejection_percent and failure_percentage_threshold are percentages (at most 100)")
	}
	if c.MaxEjectionTime != 0 && c.BaseEjectionTime > c.MaxEjectionTime {
		return fmt.Errorf("outlier_detection base_ejection_time %s is over max_ejection_time %s", time.Duration(c.BaseEjectionTime), time.Duration(c.MaxEjectionTime))
	}
	return nil
}

// Result is how an attempt ended, as outlier detection counts it.
type Result int

// Results.
const (
	// Neutral outcomes say nothing about the target's health: the client
	// went away, the policy refused the dispatch, a 429 (capacity, not
	// failure), an answer over the size limit.
	Neutral Result = iota
	// Success is any answer the target gave in time, 4xx included.
	Success
	// Failure is a 5xx or a failure of local origin.
	Failure
)

// Ejection reasons, as in Envoy's ejection stats and the metric label.
const (
	ReasonConsecutive5xx    = "consecutive_5xx"
	ReasonFailurePercentage = "failure_percentage"
	ReasonLatency           = "latency"
	ReasonProbe             = "probe_failed"
)

// States of a target's circuit.
const (
	StateClosed   = "closed"    // in every plan
	StateOpen     = "open"      // ejected: in no plan
	StateHalfOpen = "half_open" // one probe at a time
)

// Options are a Tracker's clock (tests give their own).
type Options struct {
	// Now is the clock; default time.Now.
	Now func() time.Time
	// AfterFunc runs f after d (latency_threshold); default time.AfterFunc.
	AfterFunc func(d time.Duration, f func()) interface{ Stop() bool }
}

// Tracker holds the health of every target of a catalogue.
type Tracker struct {
	mu      sync.Mutex
	targets map[string]*target
	names   []string
	now     func() time.Time
	after   func(d time.Duration, f func()) interface{ Stop() bool }
}

type target struct {
	name        string
	cfg         Config
	state       string
	consecutive int
	lastFailure string // the kind of the latest failure, for the reason
	// window is the current interval of the failure percentage.
	winStart           time.Time
	winTotal, winFails int
	ejections          int // the multiplier of the ejection time
	ejectedAt, until   time.Time
	closedAt           time.Time // when the circuit last closed (multiplier decay)
	reason             string    // why it was last ejected, in words
	probing            bool      // half-open: the probe is in flight
	total              map[string]uint64
}

// New returns a tracker for the targets named in cfg (each Config with
// defaults filled in).
func New(cfg map[string]Config, o Options) (*Tracker, error) {
	t := &Tracker{targets: make(map[string]*target, len(cfg)), now: o.Now, after: o.AfterFunc}
	if t.now == nil {
		t.now = time.Now
	}
	if t.after == nil {
		t.after = func(d time.Duration, f func()) interface{ Stop() bool } { return time.AfterFunc(d, f) }
	}
	for name, c := range cfg {
		if err := c.Validate(); err != nil {
			return nil, fmt.Errorf("target %s: %w", name, err)
		}
		t.targets[name] = &target{name: name, cfg: c.withDefaults(), state: StateClosed, total: map[string]uint64{}}
		t.names = append(t.names, name)
	}
	sort.Strings(t.names)
	return t, nil
}

// Admit reports whether target may be in a plan now; when not, reason
// says why in words ("circuit open: …; half-open in 27s"). Unknown targets
// and a nil Tracker admit.
func (t *Tracker) Admit(name string) (ok bool, reason string) {
	if t == nil {
		return true, ""
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	tg := t.targets[name]
	if tg == nil {
		return true, ""
	}
	return t.admit(tg, t.now())
}

func (t *Tracker) admit(tg *target, now time.Time) (bool, string) {
	switch tg.state {
	case StateOpen:
		if now.Before(tg.until) {
			return false, fmt.Sprintf("circuit open (%s); half-open in %s", tg.reason, tg.until.Sub(now).Round(time.Second))
		}
		tg.state, tg.probing = StateHalfOpen, false
		fallthrough
	case StateHalfOpen:
		if tg.probing {
			return false, fmt.Sprintf("circuit half-open (%s): a probe is in flight", tg.reason)
		}
	}
	return true, ""
}

// Attempt is one attempt under way; End it exactly once.
type Attempt struct {
	t       *Tracker
	tg      *target
	probe   bool
	timer   interface{ Stop() bool }
	mu      sync.Mutex
	counted bool // the latency threshold already counted it as a failure
	ended   bool
}

// Begin starts an attempt on target: ok false (with the reason) when the
// circuit is open, or half-open with its probe in flight; a half-open
// circuit's attempt is its probe. Unknown targets and a nil Tracker always
// begin (End is then a no-op).
func (t *Tracker) Begin(name string) (a *Attempt, ok bool, reason string) {
	if t == nil {
		return nil, true, ""
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	tg := t.targets[name]
	if tg == nil || tg.cfg.Disabled {
		return nil, true, ""
	}
	if ok, why := t.admit(tg, t.now()); !ok {
		return nil, false, why
	}
	a = &Attempt{t: t, tg: tg}
	if tg.state == StateHalfOpen {
		tg.probing, a.probe = true, true
	}
	if d := time.Duration(tg.cfg.LatencyThreshold); d > 0 {
		a.timer = t.after(d, a.slow)
	}
	return a, true, ""
}

// slow counts a as a failure when it passed the latency threshold unanswered.
func (a *Attempt) slow() {
	a.mu.Lock()
	if a.ended {
		a.mu.Unlock()
		return
	}
	a.counted = true
	a.mu.Unlock()
	t := a.t
	t.mu.Lock()
	defer t.mu.Unlock()
	t.record(a.tg, a.probe, Failure, fmt.Sprintf("no answer within latency_threshold %s", time.Duration(a.tg.cfg.LatencyThreshold)), ReasonLatency)
}

// End records how the attempt ended; kind names a failure for the reason
// ("timeout", "connect", "server_error"...). Calling End on a nil Attempt
// does nothing.
func (a *Attempt) End(r Result, kind string) {
	if a == nil {
		return
	}
	a.mu.Lock()
	if a.ended {
		a.mu.Unlock()
		return
	}
	a.ended = true
	counted := a.counted
	a.mu.Unlock()
	if a.timer != nil {
		a.timer.Stop()
	}
	t := a.t
	t.mu.Lock()
	defer t.mu.Unlock()
	if counted {
		// Already a failure when it passed the threshold; a late answer
		// does not undo it, a probe's verdict was given then.
		return
	}
	t.record(a.tg, a.probe, r, kind, ReasonConsecutive5xx)
}

// record applies one result; t.mu is held.
func (t *Tracker) record(tg *target, probe bool, r Result, kind, reason string) {
	now := t.now()
	if probe {
		tg.probing = false
		switch r {
		case Success:
			tg.state, tg.consecutive, tg.closedAt = StateClosed, 0, now
			tg.winStart, tg.winTotal, tg.winFails = now, 0, 0
		case Failure:
			tg.lastFailure = kind
			t.eject(tg, now, ReasonProbe, "the half-open probe failed: "+kind, true)
		}
		return
	}
	if tg.state != StateClosed || r == Neutral {
		return // an attempt begun before the ejection: the verdict is in
	}
	if now.Sub(tg.winStart) >= time.Duration(tg.cfg.Interval) {
		tg.winStart, tg.winTotal, tg.winFails = now, 0, 0
	}
	tg.winTotal++
	if r == Success {
		tg.consecutive = 0
	} else {
		tg.winFails++
		tg.consecutive++
		tg.lastFailure = kind
	}
	switch {
	case r == Success && tg.winFails == 0:
	case r == Failure && reason == ReasonLatency && tg.consecutive >= tg.cfg.Consecutive5xx:
		t.eject(tg, now, ReasonLatency, fmt.Sprintf("%d consecutive failures, the last: %s", tg.consecutive, kind), false)
	case r == Failure && tg.consecutive >= tg.cfg.Consecutive5xx:
		t.eject(tg, now, ReasonConsecutive5xx, fmt.Sprintf("%d consecutive failures, the last: %s", tg.consecutive, kind), false)
	case tg.winTotal >= tg.cfg.FailurePercentageRequestVolume && tg.winFails*100 >= tg.cfg.FailurePercentageThreshold*tg.winTotal:
		t.eject(tg, now, ReasonFailurePercentage, fmt.Sprintf("%d of %d attempts failed in %s", tg.winFails, tg.winTotal, time.Duration(tg.cfg.Interval)), false)
	}
}

// eject opens tg's circuit unless max_ejection_percent is reached (a
// failed probe re-ejects regardless: the target is out already).
func (t *Tracker) eject(tg *target, now time.Time, reason, words string, again bool) {
	if !again {
		out := 0
		for _, o := range t.targets {
			if o.state != StateClosed {
				out++
			}
		}
		limit := max(1, len(t.targets)*tg.cfg.MaxEjectionPercent/100)
		if out >= limit {
			tg.total["skipped_max_ejection_percent"]++
			return
		}
		// Envoy lowers the multiplier for each interval a host stays healthy.
		if !tg.closedAt.IsZero() && tg.cfg.Interval > 0 {
			tg.ejections = max(0, tg.ejections-int(now.Sub(tg.closedAt)/time.Duration(tg.cfg.Interval)))
		}
	}
	tg.ejections++
	d := time.Duration(math.Min(float64(tg.cfg.BaseEjectionTime)*float64(tg.ejections), float64(tg.cfg.MaxEjectionTime)))
	tg.state, tg.probing, tg.ejectedAt, tg.until, tg.reason = StateOpen, false, now, now.Add(d), words
	tg.consecutive = 0
	tg.total[reason]++
}

// Status is one target's health, for the admin API and the metrics.
type Status struct {
	Target string `json:"target"`
	// State is closed, open or half_open (an open circuit whose ejection
	// time is over reads half_open).
	State string `json:"state"`
	// ConsecutiveFailures since the last success.
	ConsecutiveFailures int `json:"consecutive_failures"`
	// IntervalAttempts and IntervalFailures count the current interval.
	IntervalAttempts int `json:"interval_attempts"`
	IntervalFailures int `json:"interval_failures"`
	// Ejections is the current multiplier of the ejection time.
	Ejections int `json:"ejections"`
	// EjectedAt and Until bound the current or last ejection (zero: never).
	EjectedAt time.Time `json:"ejected_at,omitzero"`
	Until     time.Time `json:"until,omitzero"`
	// Reason is why it was last ejected, in words.
	Reason string `json:"reason,omitempty"`
	// LastFailure is the kind of the latest failed attempt.
	LastFailure string `json:"last_failure,omitempty"`
	// EjectionsTotal counts ejections by reason since start (and
	// "skipped_max_ejection_percent" for those max_ejection_percent prevented).
	EjectionsTotal map[string]uint64 `json:"ejections_total"`
	// Disabled reports a target without outlier detection.
	Disabled bool `json:"disabled,omitempty"`
}

// Snapshot returns every target's status, sorted by name.
func (t *Tracker) Snapshot() []Status {
	if t == nil {
		return nil
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	now := t.now()
	out := make([]Status, 0, len(t.names))
	for _, n := range t.names {
		tg := t.targets[n]
		state := tg.state
		if state == StateOpen && !now.Before(tg.until) {
			state = StateHalfOpen
		}
		total := make(map[string]uint64, len(tg.total))
		for k, v := range tg.total {
			total[k] = v
		}
		out = append(out, Status{Target: n, State: state, ConsecutiveFailures: tg.consecutive, IntervalAttempts: tg.winTotal,
			IntervalFailures: tg.winFails, Ejections: tg.ejections, EjectedAt: tg.ejectedAt, Until: tg.until, Reason: tg.reason,
			LastFailure: tg.lastFailure, EjectionsTotal: total, Disabled: tg.cfg.Disabled})
	}
	return out
}
