// Package serving is Molly's T0 engine: one llama.cpp base model shared by
// every request, many LoRA adapters, an iteration-level scheduler and an
// OpenAI-compatible http.Handler (DESIGN §5).
//
// Scheduling follows Orca (Yu et al., OSDI'22): work is scheduled per model
// iteration, not per request, so new prompts join running work between steps
// (prefill is chunked) and finished or cancelled sequences leave, freeing
// their KV cells at once. Because llama.cpp applies adapters per context, not
// per token as Punica's SGMV kernels (Chen et al., MLSys'24) or S-LoRA
// (Sheng et al., MLSys'24) do, every step groups the active sequences by
// adapter set, sets that set on the context and decodes the group's tokens in
// one llama_decode; every group is decoded once per step, so no adapter's
// requests wait behind another's (fairness), and groups are as large as the
// set of sequences sharing an adapter. Adapters move between hot, warm and
// cold within byte budgets (see AdapterState).
//
// The KV cache is per sequence (llama.cpp kv_unified=false): a sequence's
// attention never sees another's cells, which keeps greedy outputs
// independent of what else runs (batch invariance), and n>1 choices copy the
// prompt's KV with llama_memory_seq_cp after one prefill.
package serving

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/molly-gateway/molly/serving/llama"
)

// Config configures an Engine.
type Config struct {
	// ModelPath is the base model GGUF (required).
	ModelPath string `json:"model_path"`
	// ModelName is the served name (`model` field); default: the file name
	// without ".gguf".
	ModelName string `json:"model_name,omitempty"`
	// AdapterDir holds LoRA adapter GGUFs, each served as
	// "<ModelName>:<file name without .gguf>"; watched by rescanning every
	// 2 s, when a request names an unknown adapter, and on Rescan (new files
	// are added, deleted files removed).
	AdapterDir string `json:"adapter_dir,omitempty"`
	// Adapters maps adapter names to GGUF paths, in addition to AdapterDir.
	Adapters map[string]string `json:"adapters,omitempty"`
	// NSeqMax is the number of concurrent sequences (KV streams); default 8.
	NSeqMax int `json:"n_seq_max,omitempty"`
	// NCtx is the total KV cache size in tokens, split evenly across the
	// sequences; default 2048 per sequence.
	NCtx int `json:"n_ctx,omitempty"`
	// NBatch is the most tokens one llama_decode carries; default 512.
	NBatch int `json:"n_batch,omitempty"`
	// PrefillChunk is the most prompt tokens a request prefills per step
	// (chunked prefill); default 256.
	PrefillChunk int `json:"prefill_chunk,omitempty"`
	// PrefixCache keeps the prompt KV of a finished request's first choice
	// in its (free) sequence and lets a later request on the same adapter
	// whose prompt shares a prefix skip the prefill chunks it fully covers.
	// Whole chunks only: a reused chunk was computed from the same tokens at
	// the same positions in the same shape as a fresh prefill would be, so
	// outputs do not change. Off by default: with it, finished sequences keep
	// their prompt cells until the sequence is reused.
	PrefixCache bool `json:"prefix_cache,omitempty"`
	// Threads is the number of CPU threads for llama.cpp; default
	// runtime.NumCPU()-1 (at least 1). More threads than free cores makes
	// every step wait for descheduled workers.
	Threads int `json:"threads,omitempty"`
	// HotBytes and WarmBytes are the adapter budgets in bytes for initialised
	// adapters and for validated file bytes in memory; defaults 256 MiB and
	// 512 MiB.
	HotBytes  int64 `json:"hot_bytes,omitempty"`
	WarmBytes int64 `json:"warm_bytes,omitempty"`
}

func (c *Config) defaults() {
	if c.ModelName == "" {
		c.ModelName = strings.TrimSuffix(filepath.Base(c.ModelPath), ".gguf")
	}
	if c.NSeqMax <= 0 {
		c.NSeqMax = 8
	}
	if c.NCtx <= 0 {
		c.NCtx = 2048 * c.NSeqMax
	}
	if c.NBatch <= 0 {
		c.NBatch = 512
	}
	if c.PrefillChunk <= 0 {
		c.PrefillChunk = 256
	}
	c.PrefillChunk = min(c.PrefillChunk, c.NBatch)
	if c.Threads <= 0 {
		// Leave a core to Caddy and the rest of the process: ggml's workers
		// spin at a barrier each op, so a descheduled worker stalls the step.
		c.Threads = max(1, runtime.NumCPU()-1)
	}
	if c.HotBytes <= 0 {
		c.HotBytes = 256 << 20
	}
	if c.WarmBytes <= 0 {
		c.WarmBytes = 512 << 20
	}
}

// Engine serves one base model and its adapters. Its methods are safe for
// concurrent use; one goroutine (the scheduler) owns the llama.cpp context.
type Engine struct {
	cfg      Config
	model    *llama.Model
	lctx     *llama.Context
	batch    *llama.Batch
	adapters *adapterManager
	tmpl     string
	nCtxSeq  int

	mu      sync.Mutex
	pending []*request
	closed  bool
	wake    chan struct{}
	calls   chan func() // run on the scheduler goroutine between steps
	quit    chan struct{}
	done    chan struct{}

	busy  atomic.Int64 // sequences in use
	steps atomic.Int64 // scheduler steps run

	// scheduler-owned
	active []*request
	free   []int                 // free sequence ids
	cached map[int]*cachedPrefix // prompt KV kept in free sequences (PrefixCache)
	logits []float32
}

// New loads the base model, creates the context and registers the adapters.
// Errors: a missing or unloadable model, a context llama.cpp cannot allocate,
// an adapter in Config.Adapters that is unreadable or refused
// (ErrAdapterRefused). Refused files found in AdapterDir are skipped, not
// fatal; Adapters lists what was accepted.
func New(cfg Config) (*Engine, error) {
	if cfg.ModelPath == "" {
		return nil, errors.New("serving: model_path is required")
	}
	cfg.defaults()
	m, err := llama.LoadModel(cfg.ModelPath)
	if err != nil {
		return nil, err
	}
	lctx, err := llama.NewContext(m, llama.ContextParams{
		NCtx: cfg.NCtx, NBatch: cfg.NBatch, NSeqMax: cfg.NSeqMax, Threads: cfg.Threads,
	})
	if err != nil {
		m.Close()
		return nil, err
	}
	am, err := newAdapterManager(m, cfg.ModelPath, cfg.HotBytes, cfg.WarmBytes)
	if err != nil {
		lctx.Close()
		m.Close()
		return nil, err
	}
	e := &Engine{
		cfg: cfg, model: m, lctx: lctx, batch: llama.NewBatch(cfg.NBatch), adapters: am,
		tmpl: m.ChatTemplate(), nCtxSeq: lctx.NCtxSeq(), cached: map[int]*cachedPrefix{},
		wake: make(chan struct{}, 1), calls: make(chan func()), quit: make(chan struct{}), done: make(chan struct{}),
	}
	if e.tmpl == "" {
		e.tmpl = "chatml"
	}
	am.dir = cfg.AdapterDir
	for name, path := range cfg.Adapters {
		if err := am.add(name, path); err != nil {
			e.closeLlama()
			return nil, err
		}
	}
	_ = am.scan(cfg.AdapterDir)
	for i := cfg.NSeqMax - 1; i >= 0; i-- {
		e.free = append(e.free, i)
	}
	go e.loop()
	if cfg.AdapterDir != "" {
		go e.watch(2 * time.Second)
	}
	return e, nil
}

// Close stops the scheduler, fails queued and running requests with
// ErrClosed and frees llama.cpp memory. It is safe to call more than once.
func (e *Engine) Close() error {
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		<-e.done
		return nil
	}
	e.closed = true
	e.mu.Unlock()
	close(e.quit)
	<-e.done
	e.closeLlama()
	return nil
}

func (e *Engine) closeLlama() {
	e.adapters.close()
	e.batch.Free()
	e.lctx.Close()
	e.model.Close()
}

// ErrClosed is returned for requests to a closed engine.
var ErrClosed = errors.New("serving: engine closed")

// Name is the served base model name.
func (e *Engine) Name() string { return e.cfg.ModelName }

// Models lists the served model names: the base, then "<base>:<adapter>" for
// every registered adapter, sorted.
func (e *Engine) Models() []string {
	out := []string{e.cfg.ModelName}
	for _, a := range e.adapters.list() {
		out = append(out, e.cfg.ModelName+":"+a.Name)
	}
	return out
}

// Adapters describes the registered adapters and their states.
func (e *Engine) Adapters() []AdapterInfo { return e.adapters.list() }

// AddAdapter registers (or replaces) adapter name from a GGUF file at run
// time. Errors: unreadable file, ErrAdapterRefused.
func (e *Engine) AddAdapter(name, path string) error { return e.adapters.add(name, path) }

// RemoveAdapter unregisters name; running requests on it finish first.
func (e *Engine) RemoveAdapter(name string) error {
	err := e.adapters.remove(name)
	e.poke()
	return err
}

// Rescan registers new adapter files found in AdapterDir. Errors: refused
// files, joined.
func (e *Engine) Rescan() error { return e.adapters.scan(e.cfg.AdapterDir) }

// ModelInfo returns facts about the base model: its llama.cpp description,
// parameter count, weight bytes, and tokens of context per sequence.
func (e *Engine) ModelInfo() (desc string, params, bytes uint64, ctxPerSeq int) {
	return e.model.Desc(), e.model.NParams(), e.model.Size(), e.nCtxSeq
}

func (e *Engine) poke() {
	select {
	case e.wake <- struct{}{}:
	default:
	}
}

// Usage counts tokens exactly: PromptTokens is the templated prompt's length
// (counted once for n choices), CompletionTokens the sampled tokens of all
// choices, excluding end-of-generation tokens.
type Usage struct {
	PromptTokens     int `json:"prompt_tokens"`
	CompletionTokens int `json:"completion_tokens"`
	TotalTokens      int `json:"total_tokens"`
	// PromptTokensDetails.CachedTokens counts prompt tokens whose KV came
	// from the prefix cache; nil when the cache is off.
	PromptTokensDetails *PromptTokensDetails `json:"prompt_tokens_details,omitempty"`
}

// PromptTokensDetails is OpenAI's breakdown of prompt tokens.
type PromptTokensDetails struct {
	CachedTokens int `json:"cached_tokens"`
}

// TokenLogprob is one sampled token's log probability and alternatives.
type TokenLogprob struct {
	Token   string
	Bytes   []byte
	Logprob float64
	Top     []TopLogprob
}

// TopLogprob is one alternative token.
type TopLogprob struct {
	Token   string
	Bytes   []byte
	Logprob float64
}

// Event is what a running request reports for one choice: text (valid UTF-8
// held back until complete, stop strings removed), the logprobs of tokens
// consumed since the last event, and on the last event a finish reason
// ("stop" or "length").
type Event struct {
	Index    int
	Text     string
	Logprobs []TokenLogprob
	Finish   string
}

// Request is a generation request for Generate.
type Request struct {
	Adapter string  // "" for the base model
	Prompt  []int32 // tokens, already templated
	N       int     // choices, default 1
	Params  SamplingParams
}

type request struct {
	ctx     context.Context
	r       Request
	entry   *adapterEntry // pinned adapter, nil once released
	key     *adapterEntry // adapter identity for the prefix cache
	seqs    []*sequence
	prefill int   // prompt tokens decoded so far
	u       Usage // scheduler-owned count, published by finish

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
}

// Tokenize templates nothing; it converts text to tokens with BOS as the
// model asks, parsing control tokens such as <|im_start|>.
func (e *Engine) Tokenize(text string) ([]int32, error) {
	return e.model.Tokenize(text, true, true)
}

// ErrContextLength is returned when a prompt does not fit a sequence's KV.
var ErrContextLength = errors.New("prompt too long")

// ErrUnknownAdapter is returned for an adapter name that is not registered.
var ErrUnknownAdapter = errors.New("unknown adapter")

// Generate runs r and calls onEvent, from the calling goroutine, for each
// event as it arrives; it returns the exact usage once every choice finished.
// Cancelling ctx stops the request within one scheduler step and frees its
// sequences. Errors: ErrContextLength, ErrUnknownAdapter, ErrAdapterRefused,
// ErrClosed, ctx.Err(), llama.cpp failures, or onEvent's error (which
// cancels the request).
func (e *Engine) Generate(ctx context.Context, r Request, onEvent func(Event) error) (Usage, error) {
	if r.N <= 0 {
		r.N = 1
	}
	if err := e.check(r); err != nil {
		return Usage{}, err
	}
	entry, _ := e.adapters.lookup(r.Adapter)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	q := &request{ctx: ctx, r: r, entry: entry, notify: make(chan struct{}, 1)}
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		return Usage{}, ErrClosed
	}
	e.pending = append(e.pending, q)
	e.mu.Unlock()
	e.poke()
	for {
		select {
		case <-q.notify:
		case <-ctx.Done():
			return Usage{}, ctx.Err()
		}
		q.mu.Lock()
		evs, done, err, usage := q.events, q.done, q.err, q.usage
		q.events = nil
		q.mu.Unlock()
		for _, ev := range evs {
			if err := onEvent(ev); err != nil {
				return Usage{}, err // deferred cancel frees the sequences
			}
		}
		if done {
			return usage, err
		}
	}
}

// check validates r: choices within the sequence count, a prompt that fits
// one sequence's context, and a registered adapter (rescanning AdapterDir once
// for an unknown name).
func (e *Engine) check(r Request) error {
	if r.N > e.cfg.NSeqMax {
		return fmt.Errorf("n=%d exceeds the engine's %d sequences", r.N, e.cfg.NSeqMax)
	}
	if len(r.Prompt) == 0 {
		return errors.New("empty prompt")
	}
	if len(r.Prompt) >= e.nCtxSeq {
		return fmt.Errorf("%w: %d tokens, the context holds %d per sequence", ErrContextLength, len(r.Prompt), e.nCtxSeq)
	}
	if r.Adapter == "" {
		return nil
	}
	if _, ok := e.adapters.lookup(r.Adapter); ok {
		return nil
	}
	_ = e.Rescan()
	if _, ok := e.adapters.lookup(r.Adapter); ok {
		return nil
	}
	if err := e.adapters.refusal(r.Adapter); err != nil {
		return err
	}
	return fmt.Errorf("%w %q", ErrUnknownAdapter, r.Adapter)
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
		e.adapters.collect()
		e.admit()
		e.reap()
		if len(e.active) == 0 {
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

// watch rescans AdapterDir every period until Close.
func (e *Engine) watch(period time.Duration) {
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		select {
		case <-e.quit:
			return
		case <-t.C:
			_ = e.Rescan()
			e.poke()
		}
	}
}

// Stats is a snapshot of the scheduler's load.
type Stats struct {
	BusySequences int   // sequences holding KV cells
	FreeSequences int   // sequences available
	Queued        int   // requests waiting for admission
	Steps         int64 // scheduler iterations so far
}

// Stats reports the scheduler's load.
func (e *Engine) Stats() Stats {
	e.mu.Lock()
	queued := len(e.pending)
	e.mu.Unlock()
	b := int(e.busy.Load())
	return Stats{BusySequences: b, FreeSequences: e.cfg.NSeqMax - b, Queued: queued, Steps: e.steps.Load()}
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

// admit moves queued requests into the running set in arrival order while
// sequences are free and their adapter can be made hot.
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
		if q.entry != nil {
			if err := e.adapters.pin(q.entry); err != nil {
				if errors.Is(err, errBusy) {
					return
				}
				e.pending = e.pending[1:]
				q.finish(err)
				continue
			}
		}
		e.pending = e.pending[1:]
		maxTok := e.nCtxSeq - len(q.r.Prompt)
		if q.r.Params.MaxTokens > 0 {
			maxTok = min(maxTok, q.r.Params.MaxTokens)
		}
		q.key = q.entry
		q.u.PromptTokens = len(q.r.Prompt)
		for i := range q.r.N {
			id := e.takeSeq(q, i == 0)
			e.busy.Add(1)
			q.seqs = append(q.seqs, &sequence{id: id, index: i, maxTokens: maxTok, smp: newSampler(q.r.Params, i)})
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

// release frees every sequence of q that is still held and unpins its
// adapter.
func (e *Engine) release(q *request) {
	for _, s := range q.seqs {
		if !s.finished {
			e.freeSeq(s)
		}
	}
	if q.entry != nil {
		e.adapters.unpin(q.entry)
		q.entry = nil
	}
}

func (e *Engine) freeSeq(s *sequence) {
	e.freeSeqKeeping(s, nil, nil)
}

// cachedPrefix is the prompt whose KV a free sequence still holds.
type cachedPrefix struct {
	key    *adapterEntry // adapter set (one adapter at scale 1; nil: base)
	tokens []int32
}

// freeSeqKeeping frees s; with the prefix cache on and prompt non-nil it keeps
// the prompt's cells (dropping the generated ones) for reuse under key.
func (e *Engine) freeSeqKeeping(s *sequence, key *adapterEntry, prompt []int32) {
	s.finished = true
	e.busy.Add(-1)
	if e.cfg.PrefixCache && prompt != nil && e.lctx.SeqRm(s.id, len(prompt), -1) {
		e.cached[s.id] = &cachedPrefix{key: key, tokens: prompt}
	} else {
		e.lctx.SeqRm(s.id, 0, -1)
		delete(e.cached, s.id)
	}
	e.free = append(e.free, s.id)
}

// takeSeq pops a free sequence for q. For the choice that prefills (first)
// it prefers the free sequence whose cached prompt covers the most whole
// prefill chunks of q's prompt on the same adapter, trims it to those
// chunks and advances q.prefill; otherwise it prefers sequences holding no
// cache. A sequence taken without reuse is emptied.
func (e *Engine) takeSeq(q *request, first bool) int {
	best, bestR := -1, 0
	if first && e.cfg.PrefixCache {
		c := e.cfg.PrefillChunk
		for i, id := range e.free {
			cp := e.cached[id]
			if cp == nil || cp.key != q.key {
				continue
			}
			l := 0
			for l < len(cp.tokens) && l < len(q.r.Prompt) && cp.tokens[l] == q.r.Prompt[l] {
				l++
			}
			// At least the last prompt token is decoded again, for logits.
			if r := min(l, len(q.r.Prompt)-1) / c * c; r > bestR {
				best, bestR = i, r
			}
		}
	}
	if best < 0 {
		best = len(e.free) - 1
		for i := len(e.free) - 1; i >= 0; i-- {
			if e.cached[e.free[i]] == nil {
				best = i
				break
			}
		}
	}
	id := e.free[best]
	e.free = append(e.free[:best], e.free[best+1:]...)
	if bestR > 0 {
		e.lctx.SeqRm(id, bestR, -1)
		q.prefill = bestR
	} else {
		e.lctx.SeqRm(id, 0, -1)
	}
	delete(e.cached, id)
	if first && e.cfg.PrefixCache {
		q.u.PromptTokensDetails = &PromptTokensDetails{CachedTokens: bestR}
	}
	return id
}

type slot struct {
	q      *request
	s      *sequence // nil for a prefill chunk that needs no logits
	bi     int       // batch index with logits, -1 if none
	prompt bool      // last prompt token: sample for every choice
}

// step decodes every adapter group once.
func (e *Engine) step() {
	var order []*adapterEntry
	groups := map[*adapterEntry][]*request{}
	for _, q := range e.active {
		if _, ok := groups[q.entry]; !ok {
			order = append(order, q.entry)
		}
		groups[q.entry] = append(groups[q.entry], q)
	}
	for _, key := range order {
		e.decodeGroup(key, groups[key])
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

func (q *request) isDone() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.done
}

// decodeGroup builds one batch for requests sharing an adapter: one token per
// generating sequence first, then prompt chunks in arrival order, within
// NBatch tokens; sets the adapter; decodes; samples.
func (e *Engine) decodeGroup(entry *adapterEntry, qs []*request) {
	b := e.batch
	b.Clear()
	var slots []slot
	for _, q := range qs {
		if q.prefill < len(q.r.Prompt) {
			continue
		}
		for _, s := range q.seqs {
			if !s.finished {
				slots = append(slots, slot{q: q, s: s, bi: b.Add(s.last, s.pos, s.id, true)})
			}
		}
	}
	for _, q := range qs {
		if q.prefill >= len(q.r.Prompt) {
			continue
		}
		room := b.Cap() - b.Len()
		n := min(e.cfg.PrefillChunk, len(q.r.Prompt)-q.prefill, room)
		if n <= 0 {
			break
		}
		s0 := q.seqs[0]
		for i := q.prefill; i < q.prefill+n; i++ {
			last := i == len(q.r.Prompt)-1
			bi := b.Add(q.r.Prompt[i], i, s0.id, last)
			if last {
				slots = append(slots, slot{q: q, bi: bi, prompt: true})
			}
		}
		q.prefill += n
	}
	if b.Len() == 0 {
		return
	}
	if entry != nil {
		e.lctx.SetAdapters([]*llama.Adapter{entry.hot}, nil)
	} else {
		e.lctx.SetAdapters(nil, nil)
	}
	if err := e.lctx.Decode(b); err != nil {
		for _, q := range qs {
			e.release(q)
			q.finish(fmt.Errorf("decode: %w", err))
		}
		return
	}
	for _, sl := range slots {
		e.logits = e.lctx.Logits(sl.bi, e.logits)
		if len(e.logits) == 0 {
			e.release(sl.q)
			sl.q.finish(errors.New("decode: llama.cpp returned no logits"))
			continue
		}
		if sl.prompt {
			// Copy the prompt's KV to the other choices before any choice
			// can finish and free sequence 0.
			p := len(sl.q.r.Prompt)
			for i, s := range sl.q.seqs {
				if i > 0 {
					e.lctx.SeqCp(sl.q.seqs[0].id, s.id)
				}
				s.pos = p
			}
			for _, s := range sl.q.seqs {
				e.accept(sl.q, s, e.logits)
			}
		} else {
			sl.s.pos++
			e.accept(sl.q, sl.s, e.logits)
		}
	}
}

// accept samples the next token of s, applies end-of-generation, stop strings
// and the token limit, and emits what can be shown.
func (e *Engine) accept(q *request, s *sequence, logits []float32) {
	if s.finished {
		return
	}
	tok := s.smp.sample(logits)
	if e.model.IsEOG(tok) {
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
	if cut, ok := findStop(s.text[s.sent:], s.smp.p.Stop); ok {
		e.end(q, s, "stop", s.sent+cut)
		return
	}
	if s.generated >= s.maxTokens {
		e.end(q, s, "length", len(s.text))
		return
	}
	hold := holdBack(s.text[s.sent:], s.smp.p.Stop)
	if upto := len(s.text) - hold; upto > s.sent || len(s.logprobs) > 0 {
		q.emit(Event{Index: s.index, Text: string(s.text[s.sent:upto]), Logprobs: s.logprobs})
		s.sent = upto
		s.logprobs = nil
	}
}

// end finishes s with text up to upto and frees its KV cells; when it was the
// request's last sequence the request completes.
func (e *Engine) end(q *request, s *sequence, reason string, upto int) {
	q.emit(Event{Index: s.index, Text: string(s.text[s.sent:max(upto, s.sent)]), Logprobs: s.logprobs, Finish: reason})
	s.sent = upto
	s.logprobs = nil
	if s == q.seqs[0] {
		e.freeSeqKeeping(s, q.key, q.r.Prompt)
	} else {
		e.freeSeq(s)
	}
	for _, o := range q.seqs {
		if !o.finished {
			return
		}
	}
	q.u.TotalTokens = q.u.PromptTokens + q.u.CompletionTokens
	if q.entry != nil {
		e.adapters.unpin(q.entry)
		q.entry = nil
	}
	q.finish(nil)
}

// findStop returns the offset in text of the earliest stop string.
func findStop(text []byte, stops []string) (int, bool) {
	best := -1
	for _, st := range stops {
		if st == "" {
			continue
		}
		if i := strings.Index(string(text), st); i >= 0 && (best < 0 || i < best) {
			best = i
		}
	}
	return best, best >= 0
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

// ContextTokens is the KV capacity of one sequence, in tokens: the longest
// prompt plus completion one request can have.
func (e *Engine) ContextTokens() int { return e.nCtxSeq }
