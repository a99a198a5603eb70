package policies

import (
	"context"
	"runtime"
	"sync/atomic"
	"time"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/metrics"
	"github.com/open-policy-agent/opa/v1/rego"
	"github.com/open-policy-agent/opa/v1/topdown"
	"go.uber.org/zap/zapcore"
)

// outcome says how one evaluation ended.
type outcome int

const (
	evalOK       outcome = iota // value holds the result, or defined is false
	evalTimeout                 // over the CPU budget or the wall-clock backstop
	evalCanceled                // the caller's context ended
	evalError                   // err says why
)

// result is one evaluation: the first expression's value of the first
// result (the query's rule), if defined.
type result struct {
	outcome outcome
	value   any
	defined bool
	err     error
	evalNS  int64 // wall-clock nanoseconds in rego's Eval
	cpuNS   int64 // thread CPU nanoseconds in rego's Eval (0 without a thread clock)
}

// noMetrics keeps rego from allocating a metrics registry per evaluation.
var noMetrics = metrics.NoOp()

// backstop is the wall-clock bound of an evaluation whose CPU budget is
// timeout: generous, because waiting for a CPU is not the policy's fault,
// but finite, so a thread that never gets to run cannot hold a request
// forever.
func backstop(timeout time.Duration) time.Duration {
	return max(20*timeout, 5*time.Second)
}

// eval runs q on input with a CPU-time budget. The evaluation runs on the
// calling goroutine, locked to its OS thread for the duration, so that the
// thread's CPU clock measures this evaluation alone; a watchdog timer
// cancels it (through OPA's topdown.Cancel) only once that clock has
// advanced by timeout, or once backstop(timeout) of wall-clock time has
// passed. Time spent runnable but not running (a loaded machine) is not
// counted against the budget. A context that ends cancels the evaluation too
// and is reported as evalCanceled, never as a timeout.
func eval(ctx context.Context, q *rego.PreparedEvalQuery, input ast.Value, timeout time.Duration) result {
	if ctx.Err() != nil {
		return result{outcome: evalCanceled, err: ctx.Err()}
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()

	w := &watchdog{cancel: topdown.NewCancel(), limit: timeout, backstop: backstop(timeout), start: time.Now()}
	w.clock, w.hasClock = currentThreadClock()
	if w.hasClock {
		if w.cpu0, w.hasClock = w.clock.now(); !w.hasClock {
			w.cpu0 = 0
		}
	}
	stop := context.AfterFunc(ctx, w.cancel.Cancel)
	first := time.AfterFunc(timeout, w.check)

	rs, err := q.Eval(ctx, rego.EvalParsedInput(input), rego.EvalExternalCancel(w.cancel), rego.EvalMetrics(noMetrics))

	w.done.Store(true)
	first.Stop()
	stop()
	r := result{evalNS: int64(time.Since(w.start))}
	if w.hasClock {
		if c, ok := w.clock.now(); ok {
			r.cpuNS = int64(c - w.cpu0)
		}
	}
	switch {
	case err == nil:
		if len(rs) > 0 && len(rs[0].Expressions) > 0 {
			r.value, r.defined = rs[0].Expressions[0].Value, true
		}
	case w.timedOut.Load():
		r.outcome, r.err = evalTimeout, err
	case ctx.Err() != nil:
		r.outcome, r.err = evalCanceled, ctx.Err()
	default:
		r.outcome, r.err = evalError, err
	}
	return r
}

// watchdog cancels one evaluation once its thread has used limit of CPU
// time or backstop of wall-clock time. check runs on timer goroutines; it
// re-arms itself for the budget left, so an evaluation that finishes in
// microseconds costs one timer that never fires.
type watchdog struct {
	cancel          topdown.Cancel
	clock           threadClock
	hasClock        bool
	cpu0            time.Duration
	start           time.Time
	limit, backstop time.Duration
	done, timedOut  atomic.Bool
}

func (w *watchdog) check() {
	if w.done.Load() {
		return
	}
	wall := time.Since(w.start)
	used := wall
	if w.hasClock {
		if c, ok := w.clock.now(); ok {
			used = c - w.cpu0
		}
	}
	if used >= w.limit || wall >= w.backstop {
		w.timedOut.Store(true)
		w.cancel.Cancel()
		return
	}
	// Not before a millisecond: the thread cannot burn the budget faster
	// than wall-clock time passes, and a tight loop of timers would.
	time.AfterFunc(max(min(w.limit-used, w.backstop-wall), time.Millisecond), w.check)
}

// evalMetrics writes an evaluation's timers (result.evalNS, result.cpuNS)
// the way OPA's decision log names them (timer_rego_query_eval_ns), plus
// the thread CPU time the timeout is measured in.
type evalMetrics struct{ evalNS, cpuNS int64 }

func (m *evalMetrics) MarshalLogObject(enc zapcore.ObjectEncoder) error {
	enc.AddInt64("timer_rego_query_eval_ns", m.evalNS)
	if m.cpuNS > 0 {
		enc.AddInt64("timer_molly_eval_cpu_ns", m.cpuNS)
	}
	return nil
}
