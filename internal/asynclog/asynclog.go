// Package asynclog takes the encoding and writing of log lines off the
// request path: a wrapped zap core queues each entry, and the queue hands
// what it holds to the wrapped core (Caddy's encoder and writer) in one
// batch, Delay after the first entry of the batch, in the order the entries
// arrived. A batch costs one goroutine wake-up however many lines it holds,
// where writing each line on its request's goroutine cost an encoding and
// a write(2) there.
//
// Nothing is dropped and the order holds: a caller that finds the queue
// full writes the queue out itself before adding its entry; after Close,
// callers write their entries themselves. Entries at DPanic level and
// above are written by the caller at once (zap panics or exits right after
// them), after the queue ahead of them. Sync writes the queue out, then
// syncs the wrapped core.
//
// Fields are evaluated when the batch is encoded, so a caller must not
// change what an ObjectMarshaler, ArrayMarshaler or slice field refers to
// after logging it (the request path's fields are strings, numbers, errors
// and values built for the line).
package asynclog

import (
	"sync"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// Delay is how long the first entry of a batch waits for others.
const Delay = time.Millisecond

// maxFree bounds the field slices kept for reuse.
const maxFree = 256

// Queue is the writer shared by the cores wrapped with it. The zero value
// is not usable; call New.
type Queue struct {
	limit int

	mu        sync.Mutex // guards the fields below
	pending   []item
	spare     []item            // the last batch's slice, reused
	free      [][]zapcore.Field // field slices of written entries, reused
	scheduled bool              // a write-out is scheduled for pending
	closed    bool

	writing sync.Mutex // held while a batch (or a caller's own line) is written: batches go out in order
}

// item is one queued entry with the core that writes it.
type item struct {
	core   zapcore.Core
	ent    zapcore.Entry
	fields []zapcore.Field
}

// New returns a queue of at most limit entries (at least 1).
func New(limit int) *Queue {
	return &Queue{limit: max(limit, 1)}
}

// add queues a copy of fields (zap reuses the caller's slice), reporting
// false when the queue is closed and the caller must write the entry
// itself. A full queue is written out first, by the caller.
func (q *Queue) add(c zapcore.Core, ent zapcore.Entry, fields []zapcore.Field) bool {
	q.mu.Lock()
	for !q.closed && len(q.pending) >= q.limit {
		q.mu.Unlock()
		q.flush()
		q.mu.Lock()
	}
	if q.closed {
		q.mu.Unlock()
		return false
	}
	var fs []zapcore.Field
	if n := len(q.free); n > 0 && cap(q.free[n-1]) >= len(fields) {
		fs, q.free = q.free[n-1], q.free[:n-1]
	}
	q.pending = append(q.pending, item{core: c, ent: ent, fields: append(fs, fields...)})
	if !q.scheduled {
		q.scheduled = true
		time.AfterFunc(Delay, q.flush)
	}
	q.mu.Unlock()
	return true
}

// flush writes out every entry queued before it.
func (q *Queue) flush() {
	q.writing.Lock()
	defer q.writing.Unlock()
	q.mu.Lock()
	batch := q.pending
	q.pending, q.spare = q.spare[:0], nil
	q.scheduled = false
	q.mu.Unlock()
	for i := range batch {
		// An encoder or writer error has nowhere better to go than the
		// wrapped core's own error output, which zap's ioCore already uses.
		_ = batch[i].core.Write(batch[i].ent, batch[i].fields)
		clear(batch[i].fields) // what the fields held is not kept alive
	}
	q.mu.Lock()
	for i := range batch {
		if len(q.free) < maxFree {
			q.free = append(q.free, batch[i].fields[:0])
		}
		batch[i] = item{}
	}
	if q.spare == nil {
		q.spare = batch[:0]
	}
	q.mu.Unlock()
}

// writeNow writes one entry on the caller's goroutine, after everything
// queued before it.
func (q *Queue) writeNow(c zapcore.Core, ent zapcore.Entry, fields []zapcore.Field) error {
	q.flush()
	q.writing.Lock()
	defer q.writing.Unlock()
	return c.Write(ent, fields)
}

// Close writes out what is queued; later entries are written by their
// callers. Close is idempotent.
func (q *Queue) Close() {
	q.mu.Lock()
	q.closed = true
	q.mu.Unlock()
	q.flush()
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

// Write queues the entry.
func (c *core) Write(ent zapcore.Entry, fields []zapcore.Field) error {
	if ent.Level >= zapcore.DPanicLevel {
		return c.q.writeNow(c.Core, ent, fields)
	}
	if c.q.add(c.Core, ent, fields) {
		return nil
	}
	return c.q.writeNow(c.Core, ent, fields)
}

func (c *core) Sync() error {
	c.q.flush()
	return c.Core.Sync()
}
