package health

import (
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// clock is a manual clock whose AfterFunc timers fire when it passes them.
type clock struct {
	mu     sync.Mutex
	now    time.Time
	timers []*timer
}

type timer struct {
	at      time.Time
	f       func()
	stopped bool
	fired   bool
}

func (t *timer) Stop() bool { was := !t.stopped && !t.fired; t.stopped = true; return was }

func (c *clock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.now }

func (c *clock) AfterFunc(d time.Duration, f func()) interface{ Stop() bool } {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := &timer{at: c.now.Add(d), f: f}
	c.timers = append(c.timers, t)
	return t
}

// advance moves the clock and runs the timers it passed.
func (c *clock) advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	var due []*timer
	for _, t := range c.timers {
		if !t.stopped && !t.fired && !t.at.After(c.now) {
			t.fired = true
			due = append(due, t)
		}
	}
	c.mu.Unlock()
	for _, t := range due {
		t.f()
	}
}

func newTracker(t *testing.T, cfg map[string]Config) (*Tracker, *clock) {
	t.Helper()
	c := &clock{now: time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)}
	tr, err := New(cfg, Options{Now: c.Now, AfterFunc: c.AfterFunc})
	if err != nil {
		t.Fatal(err)
	}
	return tr, c
}

// run begins and ends one attempt on name; it reports whether it began.
func run(tr *Tracker, name string, r Result) bool {
	a, ok, _ := tr.Begin(name)
	if ok {
		a.End(r, "timeout")
	}
	return ok
}

func state(tr *Tracker, name string) Status {
	for _, s := range tr.Snapshot() {
		if s.Target == name {
			return s
		}
	}
	return Status{}
}

func TestConsecutiveFailuresEjectAndASuccessResetsTheCount(t *testing.T) {
	tr, _ := newTracker(t, map[string]Config{"a": {Consecutive5xx: 3}, "b": {}})
	for _, r := range []Result{Failure, Failure, Success, Failure, Failure, Neutral} {
		if !run(tr, "a", r) {
			t.Fatalf("ejected before 3 failures in a row")
		}
	}
	if ok, _ := tr.Admit("a"); !ok {
		t.Fatal("two failures in a row (a success and a neutral between) ejected the target")
	}
	run(tr, "a", Failure)
	ok, why := tr.Admit("a")
	if ok || !strings.Contains(why, "circuit open (3 consecutive failures, the last: timeout); half-open in 30s") {
		t.Fatalf("after 3 failures in a row: admit %v %q", ok, why)
	}
	if _, ok, _ := tr.Begin("a"); ok {
		t.Fatal("an attempt began on an open circuit")
	}
	if s := state(tr, "a"); s.State != StateOpen || s.EjectionsTotal[ReasonConsecutive5xx] != 1 {
		t.Fatalf("status %+v", s)
	}
	if ok, _ := tr.Admit("b"); !ok {
		t.Fatal("the other target was ejected too")
	}
}

func TestHalfOpenAdmitsOneProbeAndItsVerdictDecides(t *testing.T) {
	tr, c := newTracker(t, map[string]Config{"a": {Consecutive5xx: 1, BaseEjectionTime: Duration(10 * time.Second), MaxEjectionTime: Duration(25 * time.Second)}})
	run(tr, "a", Failure)
	c.advance(9 * time.Second)
	if ok, _ := tr.Admit("a"); ok {
		t.Fatal("admitted before the ejection time ended")
	}
	c.advance(time.Second)
	if ok, _ := tr.Admit("a"); !ok {
		t.Fatal("not half-open after the base ejection time")
	}
	probe, ok, _ := tr.Begin("a")
	if !ok {
		t.Fatal("the probe did not begin")
	}
	if _, ok, why := tr.Begin("a"); ok || !strings.Contains(why, "a probe is in flight") {
		t.Fatalf("a second attempt while the probe is in flight: %v %q", ok, why)
	}
	probe.End(Failure, "connect")
	// The second ejection lasts twice the base.
	c.advance(19 * time.Second)
	if ok, _ := tr.Admit("a"); ok {
		t.Fatal("admitted 19s after a failed probe (want 20s)")
	}
	c.advance(time.Second)
	probe, ok, _ = tr.Begin("a")
	if !ok {
		t.Fatal("no probe after the second ejection time")
	}
	probe.End(Neutral, "")
	if s := state(tr, "a"); s.State != StateHalfOpen {
		t.Fatalf("a neutral probe changed the state to %s", s.State)
	}
	probe, _, _ = tr.Begin("a")
	probe.End(Success, "")
	if s := state(tr, "a"); s.State != StateClosed || s.EjectionsTotal[ReasonProbe] != 1 || s.Ejections != 2 {
		t.Fatalf("after a good probe: %+v", s)
	}
	// Third ejection: 3 × 10s capped at 25s.
	run(tr, "a", Failure)
	if s := state(tr, "a"); s.Until.Sub(s.EjectedAt) != 25*time.Second {
		t.Fatalf("third ejection lasts %s, want max_ejection_time 25s", s.Until.Sub(s.EjectedAt))
	}
}

func TestTheMultiplierDecaysWhileTheTargetStaysHealthy(t *testing.T) {
	tr, c := newTracker(t, map[string]Config{"a": {Consecutive5xx: 1, Interval: Duration(time.Minute), BaseEjectionTime: Duration(10 * time.Second)}})
	for range 3 { // ejections 1, 2, 3: each probe fails
		run(tr, "a", Failure)
		c.advance(time.Hour)
	}
	probe, _, _ := tr.Begin("a")
	probe.End(Success, "")
	c.advance(2 * time.Minute) // two healthy intervals: 3 → 1
	run(tr, "a", Failure)
	if s := state(tr, "a"); s.Ejections != 2 || s.Until.Sub(s.EjectedAt) != 20*time.Second {
		t.Fatalf("after two healthy intervals: multiplier %d, ejection %s; want 2 and 20s", s.Ejections, s.Until.Sub(s.EjectedAt))
	}
}

func TestFailurePercentageOverAnInterval(t *testing.T) {
	tr, c := newTracker(t, map[string]Config{"a": {Consecutive5xx: 100, FailurePercentageThreshold: 50, FailurePercentageRequestVolume: 10, Interval: Duration(time.Minute)}})
	// 4 of 9 fail, then the interval ends: a new window starts.
	for i := range 9 {
		run(tr, "a", map[bool]Result{true: Failure, false: Success}[i%2 == 1])
	}
	c.advance(time.Minute)
	for i := range 9 {
		run(tr, "a", map[bool]Result{true: Failure, false: Success}[i%2 == 0]) // 5 of 9
	}
	if ok, _ := tr.Admit("a"); !ok {
		t.Fatal("ejected under the request volume")
	}
	run(tr, "a", Success) // 5 of 10: 50%
	ok, why := tr.Admit("a")
	if ok || !strings.Contains(why, "5 of 10 attempts failed in 1m0s") {
		t.Fatalf("5 of 10 failed: admit %v %q", ok, why)
	}
}

// TestALatencyThresholdEjectsAHungTargetBeforeItsTimeouts: attempts that
// wait past latency_threshold count as failures at that moment, so the
// target is out while the first attempts still wait.
func TestALatencyThresholdEjectsAHungTargetBeforeItsTimeouts(t *testing.T) {
	tr, c := newTracker(t, map[string]Config{"hung": {Consecutive5xx: 3, LatencyThreshold: Duration(2 * time.Second)}})
	var waiting []*Attempt
	for range 3 {
		a, ok, _ := tr.Begin("hung")
		if !ok {
			t.Fatal("ejected before any attempt was slow")
		}
		waiting = append(waiting, a)
	}
	c.advance(time.Second)
	if ok, _ := tr.Admit("hung"); !ok {
		t.Fatal("ejected before the threshold")
	}
	c.advance(time.Second)
	ok, why := tr.Admit("hung")
	if ok || !strings.Contains(why, "no answer within latency_threshold 2s") {
		t.Fatalf("three attempts past the threshold: admit %v %q", ok, why)
	}
	for _, a := range waiting {
		a.End(Success, "") // late answers do not undo the verdict
	}
	if s := state(tr, "hung"); s.State != StateOpen || s.EjectionsTotal[ReasonLatency] != 1 {
		t.Fatalf("status %+v", s)
	}
}

func TestMaxEjectionPercentKeepsTargetsInThePlan(t *testing.T) {
	cfg := map[string]Config{}
	for _, n := range []string{"a", "b", "c", "d"} {
		cfg[n] = Config{Consecutive5xx: 1, MaxEjectionPercent: 50}
	}
	tr, _ := newTracker(t, cfg)
	for _, n := range []string{"a", "b", "c", "d"} {
		run(tr, n, Failure)
	}
	out := 0
	for _, s := range tr.Snapshot() {
		if s.State != StateClosed {
			out++
		}
	}
	if out != 2 || state(tr, "d").EjectionsTotal["skipped_max_ejection_percent"] != 1 {
		t.Fatalf("%d of 4 ejected at max_ejection_percent 50: %+v", out, tr.Snapshot())
	}
	one, _ := newTracker(t, map[string]Config{"only": {Consecutive5xx: 1}})
	run(one, "only", Failure)
	if ok, _ := one.Admit("only"); ok {
		t.Fatal("the 10% default must still let one target be ejected")
	}
}

func TestDisabledAndUnknownTargetsAreNeverEjected(t *testing.T) {
	tr, _ := newTracker(t, map[string]Config{"off": {Disabled: true, Consecutive5xx: 1}})
	for range 10 {
		run(tr, "off", Failure)
		run(tr, "unknown", Failure)
	}
	if ok, _ := tr.Admit("off"); !ok {
		t.Fatal("a disabled target was ejected")
	}
	if ok, _ := tr.Admit("unknown"); !ok {
		t.Fatal("an unknown target was ejected")
	}
	var nilTracker *Tracker
	if a, ok, _ := nilTracker.Begin("x"); !ok || a != nil {
		t.Fatal("a nil tracker refused")
	}
}

func TestConfigValidateAndMerge(t *testing.T) {
	for _, c := range []Config{{Consecutive5xx: -1}, {MaxEjectionPercent: 101}, {BaseEjectionTime: Duration(time.Hour), MaxEjectionTime: Duration(time.Minute)}} {
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "outlier_detection") {
			t.Errorf("%+v: %v", c, err)
		}
	}
	m := Config{Consecutive5xx: 2}.Merge(Config{Consecutive5xx: 7, Interval: Duration(time.Second)})
	if m.Consecutive5xx != 2 || m.Interval != Duration(time.Second) {
		t.Fatalf("merge %+v", m)
	}
	var d Duration
	if err := d.UnmarshalJSON([]byte(`"1m30s"`)); err != nil || time.Duration(d) != 90*time.Second {
		t.Fatalf("%v %v", d, err)
	}
	if err := d.UnmarshalJSON([]byte(`5000000000`)); err != nil || time.Duration(d) != 5*time.Second {
		t.Fatalf("%v %v", d, err)
	}
	if b, _ := Duration(2 * time.Second).MarshalJSON(); string(b) != `"2s"` {
		t.Fatalf("%s", b)
	}
}

func TestCollectorExposesTheCircuits(t *testing.T) {
	tr, _ := newTracker(t, map[string]Config{"lan": {Consecutive5xx: 1}, "cloud": {}})
	run(tr, "lan", Failure)
	want := `
# HELP molly_target_ejected 1 while the target's circuit is open or half-open (outlier detection), else 0.
# TYPE molly_target_ejected gauge
molly_target_ejected{target="cloud"} 0
molly_target_ejected{target="lan"} 1
`
	if err := testutil.CollectAndCompare(tr.Collector(), strings.NewReader(want), "molly_target_ejected"); err != nil {
		t.Fatal(err)
	}
	if n := testutil.CollectAndCount(tr.Collector(), "molly_target_ejections_total"); n != 10 {
		t.Fatalf("%d ejection series, want 5 reasons × 2 targets", n)
	}
}
