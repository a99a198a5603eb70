package policies

import (
	"context"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// expensive is a policy whose decision needs about 10¹⁰ evaluation steps:
// minutes of CPU, checked for cancellation at every step.
const expensive = `package molly.policy
import rego.v1
n := count([x | some x in numbers.range(1, 100000); some y in numbers.range(1, 100000); x == y])
decision := {"allow": n > 0, "tiers": ["T0"]}
`

func TestAnExpensivePolicyTimesOut(t *testing.T) {
	dir := t.TempDir()
	writePolicy(t, dir, expensive)
	e, err := New(context.Background(), Options{Dir: dir, Timeout: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Close() })
	d := e.Decide(context.Background(), routeIn("public", nil)).Decision()
	if d.Allowed() || d.Code() != CodePolicyTimeout || !strings.Contains(d.Reasons()[0], "50ms of CPU time") {
		t.Fatalf("allowed=%v code=%q reasons=%v, want a timeout denial", d.Allowed(), d.Code(), d.Reasons())
	}
}

// TestContentionIsNotATimeout decides with a small CPU budget (a few times
// what one decision needs on this machine, at least 2ms) while far more
// goroutines than CPUs spin (GOMAXPROCS raised so that they are OS threads
// competing for the cores): decisions wait for a CPU much longer than the
// budget, and none may be denied for it.
func TestContentionIsNotATimeout(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("thread CPU clocks are read on Linux only; elsewhere the budget is wall-clock time")
	}
	in := routeIn("public", map[string]any{"EMAIL": 1})
	// The budget is far below the default 250ms, yet above what the
	// runtime may charge the evaluating thread besides OPA's own work: GC
	// mark assists of its allocations, which grow when the spinners starve
	// the background mark workers, took up to a few ms and, once in 25
	// runs beside another test's load, over 10ms.
	budget := 25 * time.Millisecond
	// The memo is off: this is about evaluations, and the same input is
	// decided again and again.
	{
		e, err := New(context.Background(), Options{MemoSize: -1})
		if err != nil {
			t.Fatal(err)
		}
		runtime.LockOSThread()
		clk, _ := currentThreadClock()
		for range 20 {
			c0, _ := clk.now()
			e.Decide(context.Background(), in)
			c1, _ := clk.now()
			budget = max(budget, 5*(c1-c0))
		}
		runtime.UnlockOSThread()
	}
	e, err := New(context.Background(), Options{Timeout: budget, MemoSize: -1})
	if err != nil {
		t.Fatal(err)
	}
	spinners := 16 * runtime.NumCPU()
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(spinners + 2))
	var stop atomic.Bool
	var wg sync.WaitGroup
	for range spinners {
		wg.Add(1)
		go func() {
			defer wg.Done()
			x := 0
			for !stop.Load() {
				x++
			}
			_ = x
		}()
	}
	defer func() { stop.Store(true); wg.Wait() }()

	const n = 200
	slow := 0
	for i := range n {
		start := time.Now()
		d := e.Decide(context.Background(), in).Decision()
		if time.Since(start) > budget {
			slow++
		}
		if !d.Allowed() {
			t.Fatalf("decision %d denied under contention (budget %s): code %q %v", i, budget, d.Code(), d.Reasons())
		}
	}
	// The test proves something only if the machine really made decisions
	// wait longer than the budget.
	if slow == 0 {
		t.Fatalf("no decision of %d took more than the %s budget of wall-clock time: the spinners caused no contention", n, budget)
	}
	t.Logf("%d of %d decisions took longer than the %s CPU budget in wall-clock time; none was denied", slow, n, budget)
}

func TestAClientThatGoesAwayIsNotATimeout(t *testing.T) {
	dir := t.TempDir()
	writePolicy(t, dir, expensive)
	e, err := New(context.Background(), Options{Dir: dir, Timeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Close() })

	gone, cancel := context.WithCancel(context.Background())
	cancel()
	d := e.Decide(gone, routeIn("public", nil)).Decision()
	if d.Allowed() || d.Code() != CodeClientClosed {
		t.Fatalf("a cancelled context: code %q %v, want %s", d.Code(), d.Reasons(), CodeClientClosed)
	}

	// The client goes away 100ms into an evaluation that needs minutes.
	during, cancel := context.WithCancel(context.Background())
	defer cancel()
	time.AfterFunc(100*time.Millisecond, cancel)
	d = e.Decide(during, routeIn("public", nil)).Decision()
	if d.Allowed() || d.Code() != CodeClientClosed || !strings.Contains(d.detail, "canceled") {
		t.Fatalf("cancelled during evaluation: code %q %v (%q), want %s", d.Code(), d.Reasons(), d.detail, CodeClientClosed)
	}
	td := e.DecideTool(gone, toolInput("read", "T0", nil))
	if td.Allow || td.Code != CodeClientClosed {
		t.Fatalf("tool decision on a cancelled context: %+v", td)
	}
}

func TestTheWallClockBackstop(t *testing.T) {
	if got := backstop(250 * time.Millisecond); got != 5*time.Second {
		t.Fatalf("backstop(250ms) = %s, want 5s", got)
	}
	if got := backstop(time.Second); got != 20*time.Second {
		t.Fatalf("backstop(1s) = %s, want 20s", got)
	}
}
