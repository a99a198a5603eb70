package asynclog

import (
	"fmt"
	"runtime"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
)

// gatedCore is an observer core whose Write waits for gate to close, so
// a test can hold the background writer while it fills the queue.
type gatedCore struct {
	zapcore.Core
	gate    chan struct{}
	writing chan struct{} // receives once per Write, before it waits
}

func (g *gatedCore) With(f []zapcore.Field) zapcore.Core {
	return &gatedCore{Core: g.Core.With(f), gate: g.gate, writing: g.writing}
}

func (g *gatedCore) Check(e zapcore.Entry, ce *zapcore.CheckedEntry) *zapcore.CheckedEntry {
	if g.Enabled(e.Level) {
		return ce.AddCore(e, g)
	}
	return ce
}

func (g *gatedCore) Write(e zapcore.Entry, f []zapcore.Field) error {
	g.writing <- struct{}{}
	<-g.gate
	return g.Core.Write(e, f)
}

func TestLinesAreWrittenInOrderWithTheirFieldsAfterSync(t *testing.T) {
	obs, logs := observer.New(zap.InfoLevel)
	q := New(8)
	defer q.Close()
	l := q.Wrap(zap.New(obs)).With(zap.String("logger_field", "x"))
	fields := []zap.Field{zap.Int("n", 0)}
	const lines = 100 // more than the queue holds: senders wait for room
	for i := range lines {
		fields[0] = zap.Int("n", i)
		l.Info("line", fields...)
		fields[0] = zap.Int("n", -1) // the caller reuses its slice at once
	}
	l.Debug("below the level") // not enabled: never queued
	if err := l.Sync(); err != nil {
		t.Fatal(err)
	}
	got := logs.AllUntimed()
	if len(got) != lines {
		t.Fatalf("%d lines after Sync, want %d", len(got), lines)
	}
	for i, e := range got {
		m := e.ContextMap()
		if m["n"] != int64(i) || m["logger_field"] != "x" || e.Message != "line" {
			t.Fatalf("line %d = %q %v, want n=%d and logger_field=x", i, e.Message, m, i)
		}
	}
}

func TestNothingIsWrittenOnTheCallersGoroutineWhileTheQueueHasRoom(t *testing.T) {
	gate, writing := make(chan struct{}), make(chan struct{}, 16)
	obs, logs := observer.New(zap.InfoLevel)
	q := New(4)
	l := q.Wrap(zap.New(&gatedCore{Core: obs, gate: gate, writing: writing}))
	l.Info("first")
	<-writing // the background writer holds "first" and waits at the gate
	for i := range 4 {
		l.Info(fmt.Sprint("queued ", i)) // returns at once: four fit
	}
	if n := logs.Len(); n != 0 {
		t.Fatalf("%d lines written while the writer waits, want 0", n)
	}
	close(gate)
	q.Close()
	if n := logs.Len(); n != 5 {
		t.Fatalf("%d lines after Close, want 5", n)
	}
	// After Close the caller writes its own lines.
	l.Info("after close")
	if n := logs.Len(); n != 6 || logs.All()[5].Message != "after close" {
		t.Fatalf("after Close: %d lines, last %q", n, logs.All()[n-1].Message)
	}
	q.Close() // idempotent
}

func TestDPanicWaitsForTheQueueAndIsWrittenByTheCaller(t *testing.T) {
	obs, logs := observer.New(zap.InfoLevel)
	q := New(64)
	defer q.Close()
	l := q.Wrap(zap.New(obs)) // not Development: DPanic logs without panicking
	for range 10 {
		l.Info("before")
	}
	l.DPanic("urgent")
	got := logs.AllUntimed()
	if len(got) != 11 || got[10].Message != "urgent" {
		t.Fatalf("after DPanic returned: %d lines, want 10 then urgent", len(got))
	}
}

func TestConcurrentLoggersLoseNothing(t *testing.T) {
	obs, logs := observer.New(zap.InfoLevel)
	q := New(16)
	l := q.Wrap(zap.New(obs))
	var wg sync.WaitGroup
	const writers, each = 8, 200
	for w := range writers {
		wg.Go(func() {
			lw := l.With(zap.Int("writer", w))
			for i := range each {
				lw.Info("line", zap.Int("n", i))
			}
		})
	}
	wg.Go(func() { // Sync and Close racing the writers
		_ = l.Sync()
	})
	wg.Wait()
	q.Close()
	next := make([]int64, writers)
	for _, e := range logs.AllUntimed() {
		m := e.ContextMap()
		w := m["writer"].(int64)
		if m["n"] != next[w] {
			t.Fatalf("writer %d: line n=%v, want %d (order within a writer holds)", w, m["n"], next[w])
		}
		next[w]++
	}
	for w, n := range next {
		if n != each {
			t.Fatalf("writer %d: %d lines, want %d", w, n, each)
		}
	}
}

func TestAQueuedLineIsWrittenWithoutSync(t *testing.T) {
	obs, logs := observer.New(zap.InfoLevel)
	q := New(64)
	defer q.Close()
	l := q.Wrap(zap.New(obs))
	l.Info("alone")
	// The batch's write-out is scheduled by the line itself; wait for it.
	deadline := time.Now().Add(10 * time.Second)
	for logs.Len() == 0 && time.Now().Before(deadline) {
		runtime.Gosched()
		time.Sleep(time.Millisecond)
	}
	if logs.Len() != 1 {
		t.Fatalf("%d lines written without Sync, want 1", logs.Len())
	}
}
