// Package serving is Molly's T0 engine: one llama.cpp base model shared by
// every request, many LoRA adapters, an iteration-level scheduler and an
// OpenAI-compatible http.Handler (docs/architecture.md).
//
// Scheduling follows Orca (Yu et al., OSDI'22): work is scheduled per model
// iteration, not per request, so new prompts join running work between steps
// (prefill is chunked) and finished or cancelled sequences leave, freeing
// their KV cells at once. Every step is one llama_decode holding one token
// per generating sequence and the prompt chunks that fit, whatever adapters
// the sequences use: the base weights are read once per step for all tokens
// and each token's low-rank adapter delta is applied by adapter (the
// S-LoRA/Punica property: Sheng et al., MLSys'24; Chen et al., MLSys'24),
// see serving/llama's per-token adapters. Tokens are ordered by adapter
// within the batch, so each adapter of the step costs two small matrix
// products per adapted weight.
//
// The KV cache is one pool of cells shared by all sequences (llama.cpp
// kv_unified): a step is one micro-batch in batch order whatever sequences
// take part, and n>1 choices share the prompt's cells (llama_memory_seq_cp
// tags them, no copy). Attention (flash attention on the CPU) visits only a
// sequence's own cells, so what else runs changes a sequence's outputs only
// through floating-point rounding (ggml multiplies one column with another
// kernel than several, and cells reused out of order change the order of
// attention's sums); greedy outputs are compared in tests.
//
// Memory is one budget (Config.MemoryBytes) for KV cells held by requests and
// the prefix cache, and for hot adapter tensors; when a request needs room,
// cached prefixes and idle hot adapters are evicted lowest expected reload
// cost first (memory.go). Adapters are versioned by content (adapters.go)
// and their files watched with fsnotify (watch.go).
package serving

import (
	"context"
	"errors"
	"fmt"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/ollama/ollama/fs/ggml"

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
	// "<ModelName>:<file name without .gguf>". It is watched with fsnotify:
	// new files are added, changed files (written in place, renamed over or
	// swapped symlinks) become new versions, deleted files are removed; it
	// is also rescanned when a request names an unknown adapter and on
	// Rescan.
	AdapterDir string `json:"adapter_dir,omitempty"`
	// Adapters maps adapter names to GGUF paths, in addition to AdapterDir;
	// their files are watched too.
	Adapters map[string]string `json:"adapters,omitempty"`
	// NSeqMax is the number of concurrent sequences; default 8.
	NSeqMax int `json:"n_seq_max,omitempty"`
	// NCtx is the KV cache size in tokens (cells), shared by all sequences;
	// default 2048 per sequence. One request holds at most NCtx/NSeqMax
	// cells (prompt plus completion).
	NCtx int `json:"n_ctx,omitempty"`
	// NBatch is the most tokens one step (llama_decode) carries; default 512.
	NBatch int `json:"n_batch,omitempty"`
	// PrefillChunk is the most prompt tokens a request prefills per step
	// (chunked prefill); default 256.
	PrefillChunk int `json:"prefill_chunk,omitempty"`
	// PrefixCache keeps the prompt KV of a finished request's first choice
	// in its (free) sequence and lets a later request on the same adapter
	// version whose prompt shares a prefix skip the prefill chunks it fully
	// covers. Whole chunks only: a reused chunk was computed from the same
	// tokens at the same positions as a fresh prefill would be. Off by
	// default: with it, finished sequences keep their prompt cells until the
	// sequence is reused or the memory budget evicts them.
	PrefixCache bool `json:"prefix_cache,omitempty"`
	// Threads is the number of CPU threads for llama.cpp; default
	// runtime.NumCPU()-1 (at least 1). More threads than free cores makes
	// every step wait for descheduled workers.
	Threads int `json:"threads,omitempty"`
	// HotBytes caps the resident tensors of hot adapters, WarmBytes the
	// validated adapter file bytes kept in memory; defaults 256 MiB and
	// 512 MiB.
	HotBytes  int64 `json:"hot_bytes,omitempty"`
	WarmBytes int64 `json:"warm_bytes,omitempty"`
	// MemoryBytes is the one budget that KV cells (held by running requests
	// and the prefix cache) and hot adapter tensors draw from; default: the
	// whole KV cache plus HotBytes. The KV cache itself is allocated at
	// NCtx cells by llama.cpp; the budget decides how much of it and of the
	// adapters may be in use at once.
	MemoryBytes int64 `json:"memory_bytes,omitempty"`
	// KVCacheType is the type of the K and V cache: "f16" (default),
	// "q8_0" or "q4_0" (a quantized V cache runs with flash attention).
	// It sets the bytes of a KV cell in the memory budget.
	KVCacheType string `json:"kv_cache_type,omitempty"`
	// DraftModel is a GGUF sharing the base model's tokenizer (same
	// vocabulary and token texts; New refuses another with ErrDraftVocab)
	// that drafts tokens for greedy speculative decoding of base-model
	// requests (speculative.go); "" disables it.
	DraftModel string `json:"draft_model,omitempty"`
	// DraftTokens is how many tokens the draft proposes per verification
	// step; default 4.
	DraftTokens int `json:"draft_tokens,omitempty"`
	// Reasoning configures reasoning mode: delimiters and budgets
	// (reasoning.go).
	Reasoning ReasoningConfig `json:"reasoning,omitzero"`
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
	cfg       Config
	model     *llama.Model
	lctx      *llama.Context
	batch     *llama.Batch
	adapters  *adapterManager
	tmpl      string
	nCtxSeq   int   // cells one request may hold
	nCells    int   // cells in the KV cache
	cellBytes int64 // bytes of one KV cell (all layers, K and V)
	budget    int64 // Config.MemoryBytes
	reasoning *reasoningSpec
	spec      *speculator  // nil without Config.DraftModel
	verify    verifyState  // POST /molly/engine/verify (verify.go)
	drafter   drafterState // drafting for a remote engine (remotedraft.go)

	mu      sync.Mutex
	pending []*request
	closed  bool
	wake    chan struct{}
	calls   chan func() // run on the scheduler goroutine between steps
	quit    chan struct{}
	done    chan struct{}
	watch   *watcher
	emb     embedState // /v1/embeddings (embeddings.go)

	busy  atomic.Int64 // sequences in use
	steps atomic.Int64 // scheduler steps run

	// Counters the scheduler writes and Stats reads.
	kvReserved      atomic.Int64 // cells reserved by running requests
	kvCached        atomic.Int64 // cells held by cached prefixes
	prefixEvictions atomic.Int64
	graphReuses     atomic.Int64

	// scheduler-owned
	active  []*request
	order   []*request
	slots   []slot
	free    []int                 // free sequence ids
	cached  map[int]*cachedPrefix // prompt KV kept in free sequences (PrefixCache)
	tokCost float64               // seconds per token of a step (EWMA)
}

// New loads the base model, creates the context, registers the adapters and
// starts watching their files. Errors: a missing or unloadable model, a
// context llama.cpp cannot allocate, an adapter in Config.Adapters that is
// unreadable or refused (ErrAdapterRefused). Refused files found in
// AdapterDir are skipped, not fatal; Adapters lists what was accepted.
func New(cfg Config) (*Engine, error) {
	if cfg.ModelPath == "" {
		return nil, errors.New("serving: model_path is required")
	}
	cfg.defaults()
	f, err := os.Open(cfg.ModelPath)
	if err != nil {
		return nil, fmt.Errorf("loading model: %w", err)
	}
	g, err := ggml.Decode(f, 0)
	f.Close()
	if err != nil {
		return nil, fmt.Errorf("reading model header %s: %w", cfg.ModelPath, err)
	}
	m, err := llama.LoadModel(cfg.ModelPath)
	if err != nil {
		return nil, err
	}
	lctx, err := llama.NewContext(m, llama.ContextParams{
		NCtx: cfg.NCtx, NBatch: cfg.NBatch, NSeqMax: cfg.NSeqMax, Threads: cfg.Threads,
		Unified: true, TokenAdapters: true, TypeK: cfg.KVCacheType, TypeV: cfg.KVCacheType,
	})
	if err != nil {
		m.Close()
		return nil, err
	}
	e := &Engine{
		cfg: cfg, model: m, lctx: lctx, batch: llama.NewBatch(cfg.NBatch),
		adapters: newAdapterManager(m, g, cfg.HotBytes, cfg.WarmBytes),
		tmpl:     m.ChatTemplate(), nCtxSeq: cfg.NCtx / cfg.NSeqMax, nCells: lctx.NCtx(),
		cellBytes: kvCellBytes(g.KV(), cfg.KVCacheType), cached: map[int]*cachedPrefix{},
		wake: make(chan struct{}, 1), calls: make(chan func()), quit: make(chan struct{}), done: make(chan struct{}),
	}
	e.budget = cfg.MemoryBytes
	if e.budget <= 0 {
		e.budget = int64(e.nCells)*e.cellBytes + cfg.HotBytes
	}
	if e.tmpl == "" {
		e.tmpl = "chatml"
	}
	if e.reasoning, err = e.newReasoningSpec(cfg.Reasoning); err != nil {
		e.closeLlama()
		return nil, err
	}
	if cfg.DraftModel != "" {
		if e.spec, err = newSpeculator(m, cfg, e.nCtxSeq); err != nil {
			e.closeLlama()
			return nil, err
		}
	}
	e.adapters.dir = cfg.AdapterDir
	for name, path := range cfg.Adapters {
		if err := e.adapters.add(name, path); err != nil {
			e.closeLlama()
			return nil, err
		}
	}
	_ = e.adapters.scan(cfg.AdapterDir)
	for i := cfg.NSeqMax - 1; i >= 0; i-- {
		e.free = append(e.free, i)
	}
	e.watch = e.startWatch()
	go e.loop()
	return e, nil
}

// kvCellBytes is the size of one KV cell: K and V rows of every layer in the
// cache type typ (F16 by default; ggml's block sizes for quantized types).
func kvCellBytes(kv ggml.KV, typ string) int64 {
	layers := int64(kv.BlockCount())
	heads := max(int64(kv.HeadCountMax()), 1)
	headsKV := int64(kv.HeadCountKVMax())
	if headsKV == 0 {
		headsKV = heads
	}
	embd := int64(kv.EmbeddingLength())
	num, denom, _ := llama.KVTypeBytes(typ) // an unknown type failed NewContext already
	return layers * 2 * (embd / heads * headsKV) * num / denom
}

// Close stops the watch and the scheduler, fails queued and running requests
// with ErrClosed and frees llama.cpp memory. It is safe to call more than
// once.
func (e *Engine) Close() error {
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		<-e.done
		return nil
	}
	e.closed = true
	e.mu.Unlock()
	e.watch.close()
	close(e.quit)
	<-e.done
	e.closeLlama()
	return nil
}

func (e *Engine) closeLlama() {
	e.closeVerifiers()
	e.emb.close()
	e.verify.close()
	e.drafter.close()
	if e.spec != nil {
		e.spec.mu.Lock() // a running speculative request stops at e.quit
		e.spec.close()
	}
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

// ModelVersion is one served model name and the identity of what serves it.
type ModelVersion struct {
	ID string `json:"id"` // "<base>" or "<base>:<adapter>"
	// Version is the adapter's content version ("sha256:<hex>"), or for the
	// base its recorded checksum ("" if none).
	Version string `json:"version"`
	// Created is when this version was registered (the engine's start for
	// the base), Unix seconds.
	Created int64 `json:"created"`
}

// ModelVersions lists Models with their versions, in the same order.
func (e *Engine) ModelVersions() []ModelVersion {
	out := []ModelVersion{{ID: e.cfg.ModelName, Version: e.adapters.checksum}}
	for _, a := range e.adapters.list() {
		out = append(out, ModelVersion{ID: e.cfg.ModelName + ":" + a.Name, Version: a.Version, Created: a.Loaded.Unix()})
	}
	return out
}

// Adapters describes the registered adapters: served version and state.
func (e *Engine) Adapters() []AdapterInfo { return e.adapters.list() }

// AddAdapter registers adapter name from a GGUF file at run time, serving
// the file's content as its version (replacing a served version: running
// requests finish on theirs). It clears a DELETE's tombstone. Errors: bad
// name, unreadable file, ErrAdapterRefused.
func (e *Engine) AddAdapter(name, path string) error {
	err := e.adapters.add(name, path)
	e.watch.track(path)
	e.poke()
	return err
}

// RemoveAdapter unregisters name; running requests on it finish first. The
// adapter stays removed, even if its file in AdapterDir changes, until it is
// added again with AddAdapter or its file leaves AdapterDir. Errors: no such
// adapter.
func (e *Engine) RemoveAdapter(name string) error {
	err := e.adapters.remove(name)
	e.poke()
	return err
}

// Rescan makes the catalogue match AdapterDir and the files behind the
// registered adapters now, without waiting for the watch. Errors: refused
// files, joined.
func (e *Engine) Rescan() error {
	err := e.adapters.scan(e.cfg.AdapterDir)
	e.poke()
	return err
}

// ModelInfo returns facts about the base model: its llama.cpp description,
// parameter count, weight bytes, and tokens of context per request.
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
	// CompletionTokensDetails.ReasoningTokens counts the tokens of the
	// reasoning blocks of all choices; nil without reasoning.
	CompletionTokensDetails *CompletionTokensDetails `json:"completion_tokens_details,omitempty"`
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
// ("stop" or "length"). The first event of a request carries Version, the
// adapter version it runs on ("" for the base model). Reasoning is text of
// the choice's reasoning block (reasoning.go); every Reasoning of a choice
// comes before its first Text.
type Event struct {
	Index     int
	Text      string
	Reasoning string
	Logprobs  []TokenLogprob
	Finish    string
	Stop      string // with Finish "stop": the stop string that ended the choice, "" for none
	Version   string
}

// Request is a generation request for Generate.
type Request struct {
	Adapter string  // "" for the base model
	Prompt  []int32 // tokens, already templated
	N       int     // choices, default 1
	Params  SamplingParams
	// Reasoning, when set, opens a reasoning block: Prompt must end with
	// the start delimiter (the HTTP handler appends it).
	Reasoning *ReasoningParams
}

// Tokenize templates nothing; it converts text to tokens with BOS as the
// model asks, parsing control tokens such as <|im_start|>.
func (e *Engine) Tokenize(text string) ([]int32, error) {
	return e.model.Tokenize(text, true, true)
}

// ErrContextLength is returned when a prompt does not fit a sequence's KV.
var ErrContextLength = errors.New("prompt too long")

// ErrMemoryBudget is returned for a request whose KV cells and adapter can
// never fit Config.MemoryBytes, even with nothing else running.
var ErrMemoryBudget = errors.New("request exceeds the memory budget")

// ErrUnknownAdapter is returned for an adapter name that is not registered.
var ErrUnknownAdapter = errors.New("unknown adapter")

// Generate runs r and calls onEvent, from the calling goroutine, for each
// event as it arrives; it returns the exact usage once every choice finished.
// The adapter version is fixed when the request starts running. Cancelling
// ctx stops the request within one scheduler step and frees its sequences.
// Errors: ErrContextLength, ErrUnknownAdapter, ErrAdapterRefused,
// ErrMemoryBudget, ErrClosed, ctx.Err(), llama.cpp failures, or onEvent's
// error (which cancels the request).
//
// When ctx carries a recording OpenTelemetry span (the gateway's attempt),
// the engine's steps are its children: "molly.engine.prefill" from
// submission to the first event (queueing and prompt decode) and
// "molly.engine.decode" from there to the end, with the prompt, cached
// and completion token counts (gen_ai.usage.*) and the adapter.
func (e *Engine) Generate(ctx context.Context, r Request, onEvent func(Event) error) (Usage, error) {
	parent := trace.SpanFromContext(ctx)
	if !parent.IsRecording() {
		return e.generate(ctx, r, onEvent)
	}
	tr := parent.TracerProvider().Tracer(traceScope)
	_, prefill := tr.Start(ctx, "molly.engine.prefill", trace.WithAttributes(
		attribute.Int("molly.engine.prompt_tokens", len(r.Prompt)), attribute.String("molly.adapter", r.Adapter), attribute.Int("molly.engine.n", max(r.N, 1))))
	var decode trace.Span
	u, err := e.generate(ctx, r, func(ev Event) error {
		if decode == nil {
			prefill.End()
			_, decode = tr.Start(ctx, "molly.engine.decode", trace.WithAttributes(attribute.String("molly.adapter", r.Adapter)))
		}
		return onEvent(ev)
	})
	last := decode
	if last == nil {
		last = prefill
	}
	last.SetAttributes(attribute.Int("gen_ai.usage.input_tokens", u.PromptTokens), attribute.Int("gen_ai.usage.output_tokens", u.CompletionTokens))
	if u.PromptTokensDetails != nil {
		last.SetAttributes(attribute.Int("molly.engine.cached_tokens", u.PromptTokensDetails.CachedTokens))
	}
	if err != nil {
		last.RecordError(err)
		last.SetStatus(codes.Error, err.Error())
	}
	last.End()
	return u, err
}

// traceScope is the instrumentation scope of the engine's spans.
const traceScope = "github.com/molly-gateway/molly/serving"

func (e *Engine) generate(ctx context.Context, r Request, onEvent func(Event) error) (Usage, error) {
	if r.N <= 0 {
		r.N = 1
	}
	if err := e.check(r); err != nil {
		return Usage{}, err
	}
	if e.speculates(r) && e.spec.mu.TryLock() {
		defer e.spec.mu.Unlock()
		e.mu.Lock()
		closed := e.closed
		e.mu.Unlock()
		if closed {
			return Usage{}, ErrClosed
		}
		return e.generateSpeculative(ctx, r, onEvent)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	q := &request{ctx: ctx, r: r, notify: make(chan struct{}, 1)}
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

// ContextTokens is the KV capacity of one request, in tokens: the longest
// prompt plus completion one request can have.
func (e *Engine) ContextTokens() int { return e.nCtxSeq }
