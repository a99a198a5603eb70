package registry

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"
)

// Usage records reach downstream books (the billing tool) through a
// transactional outbox (C. Richardson, "Pattern: Transactional outbox",
// microservices.io): Record writes, in the transaction that commits the
// record, one outbox row per registered sink; a Deliverer sends the rows
// and marks them delivered once the sink acknowledged. A crash at any point
// leaves the row pending (or claimed until its claim lapses), so it is sent
// again — at least once — and the sink's idempotency by record id makes
// that exactly once in its book.

// Sink delivers one usage record to a downstream book, e.g. the billing
// tool's record_usage. It must be idempotent by u.RecordID: a record may be
// sent again (after a timeout, or a crash before its acknowledgement was
// stored). nil acknowledges the record; an error made with Permanent marks
// it failed (never retried: the sink refused it for good); any other error
// is retried with exponential backoff.
type Sink func(ctx context.Context, u Usage) error

type permanentError struct{ err error }

func (e permanentError) Error() string { return e.err.Error() }
func (e permanentError) Unwrap() error { return e.err }

// Permanent marks err as a refusal retrying cannot fix (e.g. the sink
// found the record id booked with other values, or the arguments invalid).
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return permanentError{err}
}

// IsPermanent reports whether err was made by Permanent.
func IsPermanent(err error) bool {
	var p permanentError
	return errors.As(err, &p)
}

// RegisterSink makes every usage record committed from now on, by any
// process on the file, queue for the sink called name (1-64 characters).
// Registering again is a no-op. Records committed before are not queued.
func (r *Registry) RegisterSink(ctx context.Context, name string) error {
	if name == "" || len(name) > 64 {
		return fmt.Errorf("registry: sink name %q must be 1-64 characters: %w", name, ErrInvalid)
	}
	_, err := r.db.ExecContext(ctx, `INSERT INTO outbox_sinks (name, created) VALUES (?, ?) ON CONFLICT (name) DO NOTHING`, name, ms(r.now()))
	if err != nil {
		return fmt.Errorf("registry: registering sink %s: %w", name, err)
	}
	return nil
}

// OutboxStats counts a sink's outbox rows by state.
type OutboxStats struct {
	Pending, Delivered, Failed int
	// OldestPending is when the oldest pending record was committed (zero: none).
	OldestPending time.Time
}

// Outbox returns the counts of sink's outbox, for metrics and the admin API.
func (r *Registry) Outbox(ctx context.Context, sink string) (OutboxStats, error) {
	var s OutboxStats
	if err := r.syncJournal(ctx); err != nil {
		return s, err
	}
	rows, err := r.db.QueryContext(ctx, `SELECT state, COUNT(*), MIN(created) FROM outbox WHERE sink = ? GROUP BY state`, sink)
	if err != nil {
		return s, fmt.Errorf("registry: counting the outbox of %s: %w", sink, err)
	}
	defer rows.Close()
	for rows.Next() {
		var state string
		var n int
		var oldest int64
		if err := rows.Scan(&state, &n, &oldest); err != nil {
			return s, fmt.Errorf("registry: counting the outbox of %s: %w", sink, err)
		}
		switch state {
		case "pending":
			s.Pending, s.OldestPending = n, fromMS(oldest)
		case "delivered":
			s.Delivered = n
		case "failed":
			s.Failed = n
		}
	}
	return s, rows.Err()
}

// FailedRecords returns up to limit records of sink the sink refused for
// good, with the refusal, oldest first.
func (r *Registry) FailedRecords(ctx context.Context, sink string, limit int) (ids, reasons []string, err error) {
	if err := r.syncJournal(ctx); err != nil {
		return nil, nil, err
	}
	rows, err := r.db.QueryContext(ctx, `SELECT record_id, last_error FROM outbox WHERE sink = ? AND state = 'failed' ORDER BY created, record_id LIMIT ?`, sink, limit)
	if err != nil {
		return nil, nil, fmt.Errorf("registry: listing failed deliveries of %s: %w", sink, err)
	}
	defer rows.Close()
	for rows.Next() {
		var id, reason string
		if err := rows.Scan(&id, &reason); err != nil {
			return nil, nil, fmt.Errorf("registry: listing failed deliveries of %s: %w", sink, err)
		}
		ids, reasons = append(ids, id), append(reasons, reason)
	}
	return ids, reasons, rows.Err()
}

// Requeue makes sink's failed records pending again (e.g. after fixing what
// the sink refused them for) and returns how many.
func (r *Registry) Requeue(ctx context.Context, sink string) (int, error) {
	res, err := r.db.ExecContext(ctx, `UPDATE outbox SET state = 'pending', next_at = ?, claim_until = 0 WHERE sink = ? AND state = 'failed'`, ms(r.now()), sink)
	if err != nil {
		return 0, fmt.Errorf("registry: requeueing the failed deliveries of %s: %w", sink, err)
	}
	n, _ := res.RowsAffected()
	r.nudge()
	return int(n), nil
}

// DeliveryOptions tune a Deliverer; zero values take the defaults.
type DeliveryOptions struct {
	// Timeout bounds one send (default 10 s).
	Timeout time.Duration
	// MinBackoff and MaxBackoff bound the wait before a failed record is
	// sent again: MinBackoff·2^(failures-1), at most MaxBackoff, with equal
	// jitter (half fixed, half random: M. Brooker, "Exponential Backoff And
	// Jitter", AWS Architecture Blog, 2015). Defaults 500 ms and 1 min.
	MinBackoff, MaxBackoff time.Duration
	// Poll is how often the outbox is read without a nudge (records of other
	// processes on the file, retries coming due); default 1 s.
	Poll time.Duration
	// Workers is how many records are in flight at once (default 4).
	Workers int
	// Claim is how long a record being sent is hidden from other deliverers
	// (default Timeout + 5 s); a deliverer that dies mid-send leaves its
	// claims to lapse, then they are sent again.
	Claim time.Duration
	// KeepDelivered is how long delivered rows are kept before they are
	// deleted (default 7 days); the usage table keeps the records.
	KeepDelivered time.Duration
	// Observe, when set, is called after each attempt (for logs and
	// metrics), from the deliverer's goroutines.
	Observe func(Attempt)
}

// Attempt is one send of one record and what became of it.
type Attempt struct {
	Sink  string
	Usage Usage
	// N is the attempt's number for this record (1: first send).
	N int
	// Outcome is "delivered", "retry" (sent again at Next) or "failed"
	// (refused for good); Err the sink's error (nil when delivered).
	Outcome string
	Err     error
	Next    time.Time
}

// DeliveryStats counts a Deliverer's attempts since it started.
type DeliveryStats struct {
	Delivered, Retried, Failed int64
}

// Deliverer sends a sink's outbox rows (Registry.Deliver). Safe for
// concurrent use; several deliverers of one sink, in one process or
// several, share the work through claims.
type Deliverer struct {
	r    *Registry
	sink string
	send Sink
	opts DeliveryOptions

	wake    chan struct{}
	stop    chan struct{}
	done    chan struct{}
	stopped sync.Once

	failing                    atomic.Bool // the last attempt failed: a success makes every pending record due
	delivered, retried, failed atomic.Int64
}

// Deliver registers sink (RegisterSink) and starts delivering its pending
// records — those of earlier runs included — with send until Close.
// Errors: ErrInvalid for a bad name or options; database errors.
func (r *Registry) Deliver(ctx context.Context, sink string, send Sink, opts DeliveryOptions) (*Deliverer, error) {
	if send == nil {
		return nil, fmt.Errorf("registry: delivering %s: no sink function: %w", sink, ErrInvalid)
	}
	if opts.Timeout < 0 || opts.MinBackoff < 0 || opts.MaxBackoff < 0 || opts.Poll < 0 || opts.Workers < 0 || opts.Claim < 0 || opts.KeepDelivered < 0 {
		return nil, fmt.Errorf("registry: delivering %s: durations and workers must not be negative: %w", sink, ErrInvalid)
	}
	def := func(v *time.Duration, d time.Duration) {
		if *v == 0 {
			*v = d
		}
	}
	def(&opts.Timeout, 10*time.Second)
	def(&opts.MinBackoff, 500*time.Millisecond)
	def(&opts.MaxBackoff, time.Minute)
	def(&opts.Poll, time.Second)
	def(&opts.Claim, opts.Timeout+5*time.Second)
	def(&opts.KeepDelivered, 7*24*time.Hour)
	if opts.Workers == 0 {
		opts.Workers = 4
	}
	opts.MaxBackoff = max(opts.MaxBackoff, opts.MinBackoff)
	if err := r.RegisterSink(ctx, sink); err != nil {
		return nil, err
	}
	d := &Deliverer{r: r, sink: sink, send: send, opts: opts,
		wake: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{})}
	r.wakeMu.Lock()
	r.wake[d.wake] = struct{}{}
	r.wakeMu.Unlock()
	go d.run()
	return d, nil
}

// nudge wakes the deliverers of this handle after a record committed.
func (r *Registry) nudge() {
	r.wakeMu.Lock()
	defer r.wakeMu.Unlock()
	for c := range r.wake {
		select {
		case c <- struct{}{}:
		default:
		}
	}
}

// Close stops claiming records and returns once the sends in flight are
// over (each bounded by Timeout) and their outcome stored. What is still
// pending stays in the outbox for the next deliverer.
func (d *Deliverer) Close() {
	d.stopped.Do(func() {
		close(d.stop)
		<-d.done
		d.r.wakeMu.Lock()
		delete(d.r.wake, d.wake)
		d.r.wakeMu.Unlock()
	})
}

// Stats returns the deliverer's counts.
func (d *Deliverer) Stats() DeliveryStats {
	return DeliveryStats{Delivered: d.delivered.Load(), Retried: d.retried.Load(), Failed: d.failed.Load()}
}

// claimed is one outbox row a deliverer holds.
type claimed struct {
	id       string
	attempts int
}

func (d *Deliverer) run() {
	defer close(d.done)
	slots := make(chan struct{}, d.opts.Workers)
	var wg sync.WaitGroup
	defer wg.Wait()
	lastPrune := time.Time{}
	for {
		select {
		case <-d.stop:
			return
		default:
		}
		if time.Since(lastPrune) > time.Hour {
			lastPrune = time.Now()
			d.prune()
		}
		wait := d.opts.Poll
		if free := d.opts.Workers - len(slots); free > 0 {
			batch, next, err := d.claim(free)
			switch {
			case err != nil:
			case len(batch) == free:
				wait = 0 // more may be due: claim again once a slot frees
			case !next.IsZero():
				wait = min(wait, max(next.Sub(d.r.now()), time.Millisecond))
			}
			for _, c := range batch {
				slots <- struct{}{}
				wg.Add(1)
				go func() {
					defer wg.Done()
					d.deliver(c)
					<-slots
					select { // a slot is free
					case d.wake <- struct{}{}:
					default:
					}
				}()
			}
		}
		if wait == 0 && len(slots) < d.opts.Workers {
			continue
		}
		if wait == 0 {
			wait = d.opts.Poll // every slot busy: a finishing send wakes the loop
		}
		t := time.NewTimer(wait)
		select {
		case <-d.stop:
			t.Stop()
			return
		case <-d.wake:
		case <-t.C:
		}
		t.Stop()
	}
}

// claim takes up to n due records of the sink for Claim and returns them,
// with when the next record not taken comes due (zero: none pending).
func (d *Deliverer) claim(n int) ([]claimed, time.Time, error) {
	ctx, cancel := context.WithTimeout(context.Background(), d.opts.Timeout)
	defer cancel()
	now := ms(d.r.now())
	var out []claimed
	var next sql.NullInt64
	err := d.r.tx(ctx, func(tx *sql.Tx) error {
		if err := d.r.lock(ctx, tx, "outbox/"+d.sink); err != nil { // one claimant at a time
			return err
		}
		// Both queries walk the index outbox_due in its order and stop at
		// LIMIT, so a claim costs the batch, not the backlog (an ORDER BY
		// beyond the index, or an aggregate over every pending row, made
		// each claim O(pending) and a sustained backlog quadratic).
		rows, err := tx.QueryContext(ctx, `UPDATE outbox SET claim_until = ?
			WHERE sink = ? AND record_id IN (SELECT record_id FROM outbox
				WHERE sink = ? AND state = 'pending' AND next_at <= ? AND claim_until <= ?
				ORDER BY next_at LIMIT ?)
			RETURNING record_id, attempts`, now+d.opts.Claim.Milliseconds(), d.sink, d.sink, now, now, n)
		if err != nil {
			return err
		}
		for rows.Next() {
			var c claimed
			if err := rows.Scan(&c.id, &c.attempts); err != nil {
				rows.Close()
				return err
			}
			out = append(out, c)
		}
		if err := rows.Close(); err != nil {
			return err
		}
		// The next unclaimed row to come due; a claimed one is its
		// deliverer's until it finishes (which wakes this loop) or its claim
		// lapses (the next poll sees it).
		err = tx.QueryRowContext(ctx, `SELECT next_at FROM outbox
			WHERE sink = ? AND state = 'pending' AND claim_until <= ? ORDER BY next_at LIMIT 1`, d.sink, now).Scan(&next)
		if errors.Is(err, sql.ErrNoRows) {
			return nil
		}
		return err
	})
	if err != nil {
		return nil, time.Time{}, err
	}
	var at time.Time
	if next.Valid {
		at = fromMS(next.Int64)
	}
	return out, at, nil
}

// deliver sends one claimed record and stores the outcome.
func (d *Deliverer) deliver(c claimed) {
	ctx, cancel := context.WithTimeout(context.Background(), d.opts.Timeout)
	defer cancel()
	u, err := scanUsage(d.r.db.QueryRowContext(ctx, `SELECT `+usageCols+` FROM usage WHERE record_id = ?`, c.id))
	if err != nil {
		return // the claim lapses and the record is tried again
	}
	err = d.send(ctx, u)
	a := Attempt{Sink: d.sink, Usage: u, N: c.attempts + 1, Err: err}
	now := d.r.now()
	storeCtx, cancelStore := context.WithTimeout(context.Background(), d.opts.Timeout)
	defer cancelStore()
	switch {
	case err == nil:
		a.Outcome = "delivered"
		_, _ = d.r.db.ExecContext(storeCtx, `UPDATE outbox SET state = 'delivered', attempts = attempts + 1, delivered = ?, claim_until = 0, last_error = ''
			WHERE sink = ? AND record_id = ?`, ms(now), d.sink, c.id)
		d.delivered.Add(1)
		if d.failing.Swap(false) {
			// The sink is back: what waits in backoff is due now.
			_, _ = d.r.db.ExecContext(storeCtx, `UPDATE outbox SET next_at = ? WHERE sink = ? AND state = 'pending' AND next_at > ?`, ms(now), d.sink, ms(now))
		}
	case IsPermanent(err):
		a.Outcome = "failed"
		_, _ = d.r.db.ExecContext(storeCtx, `UPDATE outbox SET state = 'failed', attempts = attempts + 1, claim_until = 0, last_error = ?
			WHERE sink = ? AND record_id = ?`, truncate(err.Error(), 500), d.sink, c.id)
		d.failed.Add(1)
	default:
		a.Outcome, a.Next = "retry", now.Add(d.backoff(a.N))
		_, _ = d.r.db.ExecContext(storeCtx, `UPDATE outbox SET attempts = attempts + 1, next_at = ?, claim_until = 0, last_error = ?
			WHERE sink = ? AND record_id = ?`, ms(a.Next), truncate(err.Error(), 500), d.sink, c.id)
		d.retried.Add(1)
		d.failing.Store(true)
	}
	if d.opts.Observe != nil {
		d.opts.Observe(a)
	}
}

// backoff is the wait after the n-th failed attempt: base·2^(n-1) capped at
// MaxBackoff, half of it fixed and half uniformly random (equal jitter).
func (d *Deliverer) backoff(n int) time.Duration {
	b := d.opts.MinBackoff
	for i := 1; i < n && b < d.opts.MaxBackoff; i++ {
		b *= 2
	}
	b = min(b, d.opts.MaxBackoff)
	half := b / 2
	return half + rand.N(b-half+1)
}

// prune deletes delivered rows older than KeepDelivered.
func (d *Deliverer) prune() {
	ctx, cancel := context.WithTimeout(context.Background(), d.opts.Timeout)
	defer cancel()
	_, _ = d.r.db.ExecContext(ctx, `DELETE FROM outbox WHERE sink = ? AND state = 'delivered' AND delivered < ?`,
		d.sink, ms(d.r.now().Add(-d.opts.KeepDelivered)))
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n]
}
