package serving

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/molly-gateway/molly/serving/llama"
)

type request struct {
	ctx      context.Context
	r        Request
	entry    *adapterEntry // pinned adapter version, nil once released
	key      *adapterEntry // adapter version for the prefix cache (nil: base)
	seqs     []*sequence
	prefill  int   // prompt tokens decoded so far
	chunk    int   // prompt tokens this step
	cells    int   // KV cells reserved (memory.go)
	split    int   // prompt tokens decoded by the base model (alora.go)
	aloraOff bool  // an aLoRA whose invocation is not in the prompt: base only
	u        Usage // scheduler-owned count, published by finish
	started  bool  // first event sent

	mu     sync.Mutex
	events []Event
	done   bool
	err    error
	usage  Usage
	notify chan struct{}
}

func (q *request) emit(ev Event) {
	q.mu.Lock()
	q.events = append(q.events, ev)
	q.mu.Unlock()
	select {
	case q.notify <- struct{}{}:
	default:
	}
}

func (q *request) finish(err error) {
	q.mu.Lock()
	q.done = true
	q.err = err
	q.usage = q.u
	q.mu.Unlock()
	select {
	case q.notify <- struct{}{}:
	default:
	}
}

func (q *request) isDone() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.done
}

// adapterID orders batches by adapter version (0: the base model).
func (q *request) adapterID() uint64 {
	if q.entry == nil {
		return 0
	}
	return q.entry.id
}

type sequence struct {
	id        int
	index     int
	pos       int
	last      int32
	generated int
	maxTokens int
	smp       *sampler
	text      []byte
	sent      int
	logprobs  []TokenLogprob
	finished  bool
	stopped   string         // the stop string that ended it, "" for none
	gr        *llama.Grammar // Params.Grammar's state (grammar.go)
	masked    []float32
	think     *thinking // reasoning block state (reasoning.go), nil without
	json      jsonEnd   // where the output's JSON value ends (Params.StopAfterValue)
}

// loop is the scheduler: admit, reap, one step, repeat.
func (e *Engine) loop() {
	defer close(e.done)
	for {
		select {
		case <-e.quit:
			e.shutdown()
			return
		default:
		}
		e.runCalls()
		e.collect()
		idle := len(e.active) == 0
		e.admit()
		if idle && len(e.active) > 0 && len(e.free) > 0 {
			e.gather()
			e.admit()
		}
		e.reap()
		if len(e.active) == 0 {
			e.lctx.Pause()
			select {
			case <-e.wake:
			case f := <-e.calls:
				f()
			case <-e.quit:
			case <-time.After(time.Second):
			}
			continue
		}
		e.step()
		e.steps.Add(1)
	}
}

// Arrival coalescing when the engine wakes from idle: requests sent together
// reach the scheduler a few hundred microseconds apart, and one that misses
// the first step waits a whole step (tens of milliseconds) and finishes a
// step later than the others. gather waits while requests keep arriving,
// gatherGap apart at most, for at most gatherMax (the added latency of a
// request that arrives alone at an idle engine).
// It polls instead of sleeping: on a busy machine a sleeping thread can wait
// milliseconds to run again, longer than the window itself.
const (
	gatherGap = 300 * time.Microsecond
	gatherMax = 2 * time.Millisecond
)

func (e *Engine) gather() {
	start := time.Now()
	last, n := start, -1
	for {
		e.mu.Lock()
		m := len(e.pending)
		e.mu.Unlock()
		now := time.Now()
		if m != n {
			last, n = now, m
		}
		if now.Sub(last) >= gatherGap || now.Sub(start) >= gatherMax {
			return
		}
		runtime.Gosched()
	}
}

func (e *Engine) runCalls() {
	for {
		select {
		case f := <-e.calls:
			f()
		default:
			return
		}
	}
}

// onScheduler runs f on the scheduler goroutine between two steps, where it
// may touch the llama.cpp context, and waits for it. Errors: ErrClosed.
func (e *Engine) onScheduler(f func()) error {
	done := make(chan struct{})
	select {
	case e.calls <- func() { f(); close(done) }:
	case <-e.done:
		return ErrClosed
	}
	<-done
	return nil
}

func (e *Engine) shutdown() {
	e.mu.Lock()
	pend := e.pending
	e.pending = nil
	e.mu.Unlock()
	for _, q := range pend {
		q.finish(ErrClosed)
	}
	for _, q := range e.active {
		e.release(q)
		q.finish(ErrClosed)
	}
	e.active = nil
}

// collect frees retired adapter versions no request uses, and the prompt KV
// cached under them.
func (e *Engine) collect() {
	for _, v := range e.adapters.collect() {
		for id, cp := range e.cached {
			if cp.key == v {
				e.dropCached(id)
			}
		}
	}
}

// admit moves queued requests into the running set in arrival order while
// sequences are free and the memory budget has room for their KV cells and
// adapter. A queued request runs on its adapter's version served at
// admission.
func (e *Engine) admit() {
	e.mu.Lock()
	defer e.mu.Unlock()
	for len(e.pending) > 0 {
		q := e.pending[0]
		if q.ctx.Err() != nil {
			e.pending = e.pending[1:]
			q.finish(q.ctx.Err())
			continue
		}
		if len(e.free) < q.r.N {
			return
		}
		var entry *adapterEntry
		if q.r.Adapter != "" {
			var ok bool
			if entry, ok = e.adapters.lookup(q.r.Adapter); !ok {
				e.pending = e.pending[1:]
				q.finish(fmt.Errorf("%w %q (removed while queued)", ErrUnknownAdapter, q.r.Adapter))
				continue
			}
		}
		maxTok := e.nCtxSeq - len(q.r.Prompt)
		if q.r.Params.MaxTokens > 0 {
			maxTok = min(maxTok, q.r.Params.MaxTokens)
		}
		q.split, q.aloraOff = baseSplit(entry, q.r.Prompt)
		reuse := e.reuseCandidate(q.r.Prompt, entry, q.split)
		cells := len(q.r.Prompt) + q.r.N*maxTok
		err := errBusy
		if e.makeRoom(cells-e.cachedLen(reuse), 0, entry, reuse) {
			err = nil
			if entry != nil {
				err = e.adapters.pin(entry, func(need int64, keep *adapterEntry) bool {
					return e.makeRoom(cells-e.cachedLen(reuse), need, keep, reuse)
				})
			}
		}
		switch {
		case errors.Is(err, errVersionGone):
			// The file changed before the watch noticed: serve the new
			// version, which the next pass admits.
			_ = e.adapters.scan(e.cfg.AdapterDir)
			return
		case errors.Is(err, errRetired):
			return // the next pass looks the name up again
		case errors.Is(err, errBusy) && len(e.active) == 0:
			// Nothing runs that could free memory: it can never fit.
			e.pending = e.pending[1:]
			q.finish(fmt.Errorf("%w: %d KV cells (%d bytes) and the adapter do not fit the memory budget of %d bytes",
				ErrMemoryBudget, cells, int64(cells)*e.cellBytes, e.budget))
			continue
		case errors.Is(err, errBusy):
			return
		case err != nil:
			e.pending = e.pending[1:]
			q.finish(err)
			continue
		}
		e.pending = e.pending[1:]
		q.entry, q.key = entry, entry
		q.cells = cells
		e.kvReserved.Add(int64(cells))
		q.u.PromptTokens = len(q.r.Prompt)
		for i := range q.r.N {
			id := e.takeSeq(q, i == 0, reuse)
			e.busy.Add(1)
			q.seqs = append(q.seqs, &sequence{id: id, index: i, maxTokens: maxTok, smp: newSampler(q.r.Params, i), think: newThinking(q.r.Reasoning)})
		}
		e.active = append(e.active, q)
	}
}

// reap drops cancelled requests, freeing their KV cells at once.
func (e *Engine) reap() {
	kept := e.active[:0]
	for _, q := range e.active {
		if err := q.ctx.Err(); err != nil {
			e.release(q)
			q.finish(err)
			continue
		}
		kept = append(kept, q)
	}
	clear(e.active[len(kept):])
	e.active = kept
}

// release frees every sequence of q that is still held, its KV reservation
// and its adapter pin.
func (e *Engine) release(q *request) {
	for _, s := range q.seqs {
		if !s.finished {
			e.freeSeq(s, nil, nil, 0)
		}
	}
	e.unreserve(q)
}

func (e *Engine) unreserve(q *request) {
	e.kvReserved.Add(-int64(q.cells))
	q.cells = 0
	if q.entry != nil {
		e.adapters.unpin(q.entry)
		q.entry = nil
	}
}

// freeSeq frees s; with the prefix cache on and prompt non-nil it keeps the
// prompt's cells (dropping the generated ones) for reuse under key.
func (e *Engine) freeSeq(s *sequence, key *adapterEntry, prompt []int32, split int) {
	s.finished = true
	s.closeGrammar()
	e.busy.Add(-1)
	if e.cfg.PrefixCache && prompt != nil && e.lctx.SeqRm(s.id, len(prompt), -1) {
		e.cached[s.id] = &cachedPrefix{key: key, tokens: prompt, split: split, lastUsed: time.Now()}
		e.kvCached.Add(int64(len(prompt)))
	} else {
		e.lctx.SeqRm(s.id, 0, -1)
	}
	e.free = append(e.free, s.id)
}

// reuseCandidate is the free sequence whose cached prompt covers the most
// whole prefill chunks of prompt computed as this request computes them
// (same adapter version, or the base model's part: reusableLen) (-1: none),
// leaving at least the last prompt token to decode (for logits).
func (e *Engine) reuseCandidate(prompt []int32, key *adapterEntry, split int) int {
	if !e.cfg.PrefixCache {
		return -1
	}
	best, bestR := -1, 0
	c := e.cfg.PrefillChunk
	for _, id := range e.free {
		cp := e.cached[id]
		if cp == nil {
			continue
		}
		l := reusableLen(cp, prompt, key, split)
		if r := min(l, len(prompt)-1) / c * c; r > bestR {
			best, bestR = id, r
		}
	}
	return best
}

// takeSeq pops a free sequence for q: for the choice that prefills (first)
// the reuse candidate if any, trimmed to the whole chunks it covers (q's
// prefill starts after them); otherwise a free sequence holding no cache if
// there is one. A sequence taken without reuse is emptied.
func (e *Engine) takeSeq(q *request, first bool, reuse int) int {
	pick := -1
	if first && reuse >= 0 {
		pick = slices.Index(e.free, reuse)
	}
	reused := 0
	if pick >= 0 {
		l := reusableLen(e.cached[reuse], q.r.Prompt, q.key, q.split)
		reused = min(l, len(q.r.Prompt)-1) / e.cfg.PrefillChunk * e.cfg.PrefillChunk
	} else {
		pick = len(e.free) - 1
		for i := len(e.free) - 1; i >= 0; i-- {
			if e.cached[e.free[i]] == nil {
				pick = i
				break
			}
		}
	}
	id := e.free[pick]
	e.free = append(e.free[:pick], e.free[pick+1:]...)
	if cp := e.cached[id]; cp != nil {
		e.kvCached.Add(-int64(len(cp.tokens)))
		delete(e.cached, id)
	}
	if reused > 0 {
		e.lctx.SeqRm(id, reused, -1)
		q.prefill = reused
	} else {
		e.lctx.SeqRm(id, 0, -1)
	}
	if first && e.cfg.PrefixCache {
		q.u.PromptTokensDetails = &PromptTokensDetails{CachedTokens: reused}
	}
	return id
}

type slot struct {
	q      *request
	s      *sequence // nil for the last prompt token
	bi     int       // batch index with logits
	prompt bool      // last prompt token: sample for every choice
}

// step runs one llama_decode for every running request: one token per
// generating sequence, then prompt chunks in arrival order within NBatch;
// tokens are laid out by adapter version so that each adapter's tokens are
// one run (serving/llama applies them per token).
func (e *Engine) step() {
	b := e.batch
	b.Clear()
	room := b.Cap()
	for _, q := range e.active {
		if q.prefill >= len(q.r.Prompt) {
			for _, s := range q.seqs {
				if !s.finished {
					room--
				}
			}
		}
	}
	for _, q := range e.active {
		q.chunk = 0
		if q.prefill < len(q.r.Prompt) && room > 0 {
			q.chunk = min(e.cfg.PrefillChunk, len(q.r.Prompt)-q.prefill, room)
			room -= q.chunk
		}
	}
	e.order = append(e.order[:0], e.active...)
	slices.SortStableFunc(e.order, func(x, y *request) int { return cmp.Compare(x.adapterID(), y.adapterID()) })
	slots := e.slots[:0]
	for _, q := range e.order {
		var a *llama.Adapter
		if q.entry != nil && !q.aloraOff {
			a = q.entry.hot
		}
		if q.prefill >= len(q.r.Prompt) {
			for _, s := range q.seqs {
				if !s.finished {
					slots = append(slots, slot{q: q, s: s, bi: b.AddAdapted(s.last, s.pos, s.id, true, a, 1)})
				}
			}
			continue
		}
		s0 := q.seqs[0]
		for i := q.prefill; i < q.prefill+q.chunk; i++ {
			last := i == len(q.r.Prompt)-1
			ai := a
			if i < q.split { // aLoRA: the base model before the invocation
				ai = nil
			}
			bi := b.AddAdapted(q.r.Prompt[i], i, s0.id, last, ai, 1)
			if last {
				slots = append(slots, slot{q: q, bi: bi, prompt: true})
			}
		}
		q.prefill += q.chunk
	}
	e.slots = slots
	if b.Len() > 0 {
		start := time.Now()
		err := e.lctx.Decode(b)
		e.graphReuses.Store(int64(e.lctx.GraphReuses()))
		if d := time.Since(start).Seconds() / float64(b.Len()); e.tokCost == 0 {
			e.tokCost = d
		} else {
			e.tokCost += 0.1 * (d - e.tokCost)
		}
		if err != nil {
			for _, q := range e.active {
				e.release(q)
				q.finish(fmt.Errorf("decode: %w", err))
			}
			e.active = e.active[:0]
			return
		}
		for _, sl := range slots {
			logits := e.lctx.LogitsView(sl.bi)
			if len(logits) == 0 {
				e.release(sl.q)
				sl.q.finish(errors.New("decode: llama.cpp returned no logits"))
				continue
			}
			if sl.q.isDone() {
				continue
			}
			if sl.prompt {
				// The other choices share the prompt's cells; copy before
				// any choice can finish and free sequence 0.
				p := len(sl.q.r.Prompt)
				for i, s := range sl.q.seqs {
					if i > 0 {
						e.lctx.SeqCp(sl.q.seqs[0].id, s.id, 0, -1)
					}
					s.pos = p
				}
				for _, s := range sl.q.seqs {
					e.accept(sl.q, s, logits)
				}
			} else {
				sl.s.pos++
				e.accept(sl.q, sl.s, logits)
			}
		}
	}
	kept := e.active[:0]
	for _, q := range e.active {
		if !q.isDone() {
			kept = append(kept, q)
		}
	}
	clear(e.active[len(kept):])
	e.active = kept
}

// accept samples the next token of s, applies end-of-generation, stop strings
// and the token limit, and emits what can be shown.
func (e *Engine) accept(q *request, s *sequence, logits []float32) {
	if s.finished {
		return
	}
	if s.think != nil && !s.think.done {
		// The reasoning block is free text: a grammar constrains the
		// answer after it.
		e.acceptThinking(q, s, logits)
		return
	}
	tok, err := e.sampleNext(s, logits)
	if err != nil {
		e.release(q)
		q.finish(err)
		return
	}
	if tok < 0 || e.model.IsEOG(tok) {
		e.end(q, s, "stop", len(s.text))
		return
	}
	s.generated++
	q.u.CompletionTokens++
	piece := e.model.TokenPiece(tok)
	if s.smp.p.Logprobs {
		lp, ids, lps := logSoftmax(logits, tok, s.smp.p.TopLogprobs)
		tl := TokenLogprob{Token: string(piece), Bytes: piece, Logprob: lp}
		for i, id := range ids {
			pb := e.model.TokenPiece(id)
			tl.Top = append(tl.Top, TopLogprob{Token: string(pb), Bytes: pb, Logprob: lps[i]})
		}
		s.logprobs = append(s.logprobs, tl)
	}
	s.text = append(s.text, piece...)
	s.last = tok
	if cut, st, ok := findStop(s.text[s.sent:], s.smp.p.Stop); ok {
		s.stopped = st
		e.end(q, s, "stop", s.sent+cut)
		return
	}
	if s.smp.p.StopAfterValue {
		if end, ok := s.json.feed(piece); ok {
			e.end(q, s, "stop", len(s.text)-len(piece)+end)
			return
		}
	}
	if s.generated >= s.maxTokens {
		e.end(q, s, "length", len(s.text))
		return
	}
	hold := holdBack(s.text[s.sent:], s.smp.p.Stop)
	if upto := len(s.text) - hold; upto > s.sent || len(s.logprobs) > 0 {
		e.send(q, Event{Index: s.index, Text: string(s.text[s.sent:upto]), Logprobs: s.logprobs})
		s.sent = upto
		s.logprobs = nil
	}
}

// send emits ev, stamping the request's first event with its version.
func (e *Engine) send(q *request, ev Event) {
	if !q.started {
		q.started = true
		if q.key != nil {
			ev.Version = q.key.version
		}
	}
	q.emit(ev)
}

// end finishes s with text up to upto and frees its KV cells; when it was the
// request's last sequence the request completes.
func (e *Engine) end(q *request, s *sequence, reason string, upto int) {
	e.send(q, Event{Index: s.index, Text: string(s.text[s.sent:max(upto, s.sent)]), Logprobs: s.logprobs, Finish: reason, Stop: s.stopped})
	s.sent = upto
	s.logprobs = nil
	if s == q.seqs[0] {
		e.freeSeq(s, q.key, q.r.Prompt, q.split)
	} else {
		e.freeSeq(s, nil, nil, 0)
	}
	for _, o := range q.seqs {
		if !o.finished {
			return
		}
	}
	q.u.TotalTokens = q.u.PromptTokens + q.u.CompletionTokens
	e.unreserve(q)
	q.finish(nil)
}

// findStop returns the offset in text of the earliest stop string, and
// that string (the first listed of those starting there).
func findStop(text []byte, stops []string) (int, string, bool) {
	best, which := -1, ""
	for _, st := range stops {
		if st == "" {
			continue
		}
		if i := strings.Index(string(text), st); i >= 0 && (best < 0 || i < best) {
			best, which = i, st
		}
	}
	return best, which, best >= 0
}

// holdBack is how many trailing bytes of text must not be shown yet: the
// longest suffix that starts a stop string (it may complete with the next
// token, so stop strings split across tokens are still removed) or an
// incomplete UTF-8 character.
func holdBack(text []byte, stops []string) int {
	h := 0
	for _, st := range stops {
		for k := min(len(st)-1, len(text)); k > h; k-- {
			if strings.HasSuffix(string(text), st[:k]) {
				h = k
				break
			}
		}
	}
	// An incomplete UTF-8 character just before the held stop prefix.
	base := text[:len(text)-h]
	for k := 1; k <= min(3, len(base)); k++ {
		if utf8.RuneStart(base[len(base)-k]) {
			if !utf8.FullRune(base[len(base)-k:]) {
				h += k
			}
			break
		}
	}
	return h
}
