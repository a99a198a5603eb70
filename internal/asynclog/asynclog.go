// Package asynclog takes the encoding and writing of log lines off the
// request path: a wrapped zap core hands each entry to one background
// goroutine, which passes it to the wrapped core (Caddy's encoder and
// writer) in the order the entries arrived.
//
// Nothing is dropped and the order holds: while the queue is full a caller
// waits for room (the writer is draining it); after Close, callers write
// their entries themselves. Entries at DPanic level and above are written by
// the caller at once (zap panics or exits right after them), after the
// queue ahead of them. Sync waits until every entry queued before it is
// written, then syncs the wrapped core.
//
// Fields are evaluated when the background goroutine encodes them, so a
// caller must not change what an ObjectMarshaler, ArrayMarshaler or slice
// field refers to after logging it (the request path's fields are strings,
// numbers, errors and values built for the line).
package asynclog

import (
	"sync"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// Queue is the background writer shared by the cores wrapped with it.
// The zero value is not usable; call New.
type Queue struct {
	ch   chan item
	mu   sync.RWMutex // held for reading by senders, for writing by Close
	done chan struct{}
	shut bool
}

// item is one queued entry, or (core nil) a Sync marker whose channel is
// closed once every entry before it is written.
type item struct {
	core   zapcore.Core
	ent    zapcore.Entry
	fields []zapcore.Field
	synced chan struct{}
}

// New starts a queue of at most depth entries (at least 1).
func New(depth int) *Queue {
	q := &Queue{ch: make(chan item, max(depth, 1)), done: make(chan struct{})}
	go q.run()
	return q
}

func (q *Queue) run() {
	defer close(q.done)
	for it := range q.ch {
		if it.core == nil {
			close(it.synced)
			continue
		}
		// An encoder or writer error has nowhere better to go than the
		// wrapped core's own error output, which zap's ioCore already uses.
		_ = it.core.Write(it.ent, it.fields)
	}
}

// send queues it, waiting while the queue is full; it reports false when
// the queue is closed and the caller must write it itself.
func (q *Queue) send(it item) bool {
	q.mu.RLock()
	defer q.mu.RUnlock()
	if q.shut {
		return false
	}
	q.ch <- it
	return true
}

// flush waits until every entry queued before it is written. It reports
// false when the queue is closed (nothing is pending then).
func (q *Queue) flush() bool {
	q.mu.RLock()
	if q.shut {
		q.mu.RUnlock()
		return false
	}
	synced := make(chan struct{})
	q.ch <- item{synced: synced} // blocks while full: the writer is draining
	q.mu.RUnlock()
	<-synced
	return true
}

// Close writes what is queued and stops the goroutine; later entries are
// written by their callers. Close is idempotent.
func (q *Queue) Close() {
	q.mu.Lock()
	if !q.shut {
		q.shut = true
		close(q.ch)
	}
	q.mu.Unlock()
	<-q.done
}

// Wrap returns l with its core wrapped so that entries go through q.
func (q *Queue) Wrap(l *zap.Logger) *zap.Logger {
	return l.WithOptions(zap.WrapCore(func(c zapcore.Core) zapcore.Core { return &core{Core: c, q: q} }))
}

// core is a zapcore.Core whose Write queues.
type core struct {
	zapcore.Core
	q *Queue
}

func (c *core) With(fields []zapcore.Field) zapcore.Core {
	return &core{Core: c.Core.With(fields), q: c.q}
}

func (c *core) Check(ent zapcore.Entry, ce *zapcore.CheckedEntry) *zapcore.CheckedEntry {
	if c.Enabled(ent.Level) {
		return ce.AddCore(ent, c)
	}
	return ce
}

// Write queues a copy of fields (zap reuses the caller's slice).
func (c *core) Write(ent zapcore.Entry, fields []zapcore.Field) error {
	if ent.Level >= zapcore.DPanicLevel {
		c.q.flush()
		return c.Core.Write(ent, fields)
	}
	if c.q.send(item{core: c.Core, ent: ent, fields: append([]zapcore.Field(nil), fields...)}) {
		return nil
	}
	return c.Core.Write(ent, fields)
}

func (c *core) Sync() error {
	c.q.flush()
	return c.Core.Sync()
}
