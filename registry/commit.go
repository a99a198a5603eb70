package registry

import (
	"context"
	"fmt"
	"runtime"
	"sync"
)

// maxGroup bounds the records of one group commit, so that one transaction
// holds the file's write lock for a bounded time (a few ms).
const maxGroup = 256

// groupCommit commits the usage records of concurrent Record calls
// together: group commit, as databases do for their own log (Gray & Reuter,
// "Transaction Processing: Concepts and Techniques", 1993, §9.4.7; the
// writer queue of LevelDB). Callers queue their record; the first one
// finds no commit running and leads: it takes every record queued at that
// moment (itself included, up to maxGroup), writes them in one
// transaction, commits, and wakes their callers; if more records queued
// meanwhile it hands the lead to the first of them, which does the same.
// One caller alone pays one transaction and no hand-off; sixteen at once
// pay few commits (one WAL append of the pages they share) instead of
// sixteen. Every record still commits before its Record returns.
type groupCommit struct {
	mu      sync.Mutex
	queue   []*pending
	leading bool // a caller leads (or has been handed the lead); false only when queue is empty
	shared  bool // the last group held more than one record
	commits int  // transactions committed or tried, for tests
}

// pending is one Record call's record until the commit that includes it.
type pending struct {
	ctx   context.Context
	u     Usage
	id    string
	err   error
	state int           // queued, lead or taken, under groupCommit.mu
	wake  chan struct{} // receives once: told to lead, or the result is set
}

const (
	queued = iota // in the queue
	lead          // first of the queue, told to lead the next group
	taken         // in a group being committed
)

// record queues u and returns once the commit that includes it is done.
func (g *groupCommit) record(ctx context.Context, r *Registry, u Usage) (string, error) {
	if err := ctx.Err(); err != nil {
		return "", fmt.Errorf("registry: recording usage for %s: %w", u.Member, err)
	}
	p := &pending{ctx: ctx, u: u, wake: make(chan struct{}, 1)}
	g.mu.Lock()
	g.queue = append(g.queue, p)
	if !g.leading {
		g.leading, p.state = true, lead
		yield := g.shared
		g.mu.Unlock()
		if yield {
			// The last commit was shared, so the callers it woke are
			// likely runnable but not yet queued again: yielding once
			// lets them join this group instead of a convoy of groups of
			// one, led by whichever caller the scheduler runs first.
			runtime.Gosched()
		}
		g.lead(r, p)
		return p.id, p.err
	}
	g.mu.Unlock()
	select {
	case <-p.wake:
	case <-ctx.Done():
		g.mu.Lock()
		if p.state == queued { // not in a group yet: withdraw it
			g.remove(p)
			g.mu.Unlock()
			return "", fmt.Errorf("registry: recording usage for %s: %w", u.Member, ctx.Err())
		}
		g.mu.Unlock()
		<-p.wake // in a group being committed, or told to lead: see it through
	}
	g.mu.Lock()
	leads := p.state == lead
	g.mu.Unlock()
	if leads {
		runtime.Gosched() // records were waiting: more are likely on their way (as above)
		g.lead(r, p)
	}
	return p.id, p.err
}

// remove takes p out of the queue (under mu).
func (g *groupCommit) remove(p *pending) {
	for i, q := range g.queue {
		if q == p {
			g.queue = append(g.queue[:i], g.queue[i+1:]...)
			return
		}
	}
}

// lead commits the records queued now (self is the first of them), sets
// their results, hands the lead to the next queued record if there is one,
// and wakes the group's other callers. A record whose caller's context has
// ended by then is left out with that error.
func (g *groupCommit) lead(r *Registry, self *pending) {
	g.mu.Lock()
	n := min(len(g.queue), maxGroup)
	group := make([]*pending, 0, n)
	for _, p := range g.queue[:n] {
		p.state = taken
		if err := p.ctx.Err(); err != nil {
			p.err = fmt.Errorf("registry: recording usage for %s: %w", p.u.Member, err)
			continue
		}
		group = append(group, p)
	}
	var leftOut []*pending
	if len(group) < n {
		for _, p := range g.queue[:n] {
			if p.err != nil {
				leftOut = append(leftOut, p)
			}
		}
	}
	g.queue = append(g.queue[:0], g.queue[n:]...)
	g.shared = n > 1
	if len(group) > 0 {
		g.commits++
	}
	g.mu.Unlock()

	if len(group) > 0 {
		r.commitGroup(group)
	}

	g.mu.Lock()
	if len(g.queue) > 0 {
		next := g.queue[0]
		next.state = lead
		next.wake <- struct{}{}
	} else {
		g.leading = false
	}
	g.mu.Unlock()
	for _, p := range group {
		if p != self {
			p.wake <- struct{}{}
		}
	}
	for _, p := range leftOut {
		if p != self {
			p.wake <- struct{}{}
		}
	}
}

// commitGroup writes group's records in one transaction and sets each
// one's id or error. When the transaction fails, each record is tried
// again in a transaction of its own, so one bad record fails alone.
func (r *Registry) commitGroup(group []*pending) {
	// A group outlives any one caller's context: whoever joined it waits
	// for its commit (the file's busy timeout bounds that).
	ctx := context.WithoutCancel(group[0].ctx)
	err := r.txq(ctx, func(tx q) error {
		us := make([]Usage, len(group))
		for i, p := range group {
			us[i] = p.u
		}
		ids, err := r.recordBatch(tx, us)
		if err != nil {
			return err
		}
		for i, p := range group {
			p.id = ids[i]
		}
		return nil
	})
	if err == nil {
		r.nudge()
		return
	}
	if len(group) == 1 {
		group[0].id, group[0].err = "", fmt.Errorf("registry: recording usage for %s: %w", group[0].u.Member, err)
		return
	}
	for _, p := range group {
		p.id, p.err = r.recordAlone(context.WithoutCancel(p.ctx), p.u)
	}
}
