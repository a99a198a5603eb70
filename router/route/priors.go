package route

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"
)

// PriorKey names one quality prior: a target, the upstream model it was
// sent (a T0 adapter is "<base>:<adapter>"), and a task category.
type PriorKey struct {
	Target   string
	Model    string
	Category string
}

func (k PriorKey) String() string { return k.Target + "/" + k.Model + "/" + k.Category }

// Prior kinds, the Kind of a PriorRecord.
const (
	PriorQuality = "quality"      // answer quality in [0,1] per (target, model, category)
	PriorTTFB    = "ttfb_s"       // seconds to the first byte of the answer, per target (Model, Category "")
	PriorTotal   = "total_s"      // seconds to the whole answer, per target (Model, Category "")
	PriorTPS     = "tokens_per_s" // completion tokens per second of generation, per (target, model)
)

// PriorRecord is one learned value as a PriorStore keeps it.
type PriorRecord struct {
	Kind string
	PriorKey
	Value   float64   // the EWMA: quality in [0,1] or seconds
	N       int64     // observations folded in
	Updated time.Time // last observation
}

// PriorStore persists learned priors. Load returns every record (any
// order); Save inserts or replaces the given records by (Kind, Target,
// Model, Category) and returns once they are durable. Implementations:
// MemoryPriorStore here, SQLite in registry (PriorStore there).
type PriorStore interface {
	Load() ([]PriorRecord, error)
	Save(records []PriorRecord) error
}

// MemoryPriorStore is the in-memory PriorStore (the default): it keeps
// records for the life of the process. Safe for concurrent use.
type MemoryPriorStore struct {
	mu sync.Mutex
	m  map[recordKey]PriorRecord
}

type recordKey struct {
	kind string
	PriorKey
}

// Load returns the saved records, sorted by kind and key.
func (s *MemoryPriorStore) Load() ([]PriorRecord, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := slices.Collect(maps.Values(s.m))
	slices.SortFunc(out, func(a, b PriorRecord) int {
		if c := compareStrings(a.Kind, b.Kind); c != 0 {
			return c
		}
		return compareStrings(a.PriorKey.String(), b.PriorKey.String())
	})
	return out, nil
}

// Save upserts records.
func (s *MemoryPriorStore) Save(records []PriorRecord) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.m == nil {
		s.m = map[recordKey]PriorRecord{}
	}
	for _, r := range records {
		s.m[recordKey{r.Kind, r.PriorKey}] = r
	}
	return nil
}

func compareStrings(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// EWMA smoothing factors. An exponentially weighted moving average
// v ← (1−α)·v + α·x gives the k-th most recent observation the weight
// α(1−α)^k, so its memory is about 1/α observations (NIST/SEMATECH
// e-Handbook of Statistical Methods, §6.3.2.4, "EWMA control charts").
const (
	// DefaultQualityAlpha: feedback and verifier scores are noisy; about
	// ten of them move a prior most of the way.
	DefaultQualityAlpha = 0.1
	// DefaultLatencyAlpha: latency follows load, so it forgets faster
	// (about three observations).
	DefaultLatencyAlpha = 0.3
)

// Decision memory bounds: feedback is accepted for a decision this long
// after it was made, and for at most this many recent decisions.
const (
	DefaultDecisionTTL      = time.Hour
	DefaultDecisionCapacity = 10000
)

// Feedback errors.
var (
	// ErrUnknownDecision: the id was never routed here, has expired or was evicted.
	ErrUnknownDecision = errors.New("unknown decision id")
	// ErrFeedbackGiven: the decision already received its feedback.
	ErrFeedbackGiven = errors.New("feedback already given for this decision")
)

// Priors holds learned quality priors per (target, model, category) and
// latency per target, as EWMAs over observations, seeded from the config
// (a quality prior starts at the configured value; a latency is the first
// observation), plus a bounded memory of recent decisions so explicit
// feedback can find what it is about. Safe for concurrent use; a Caddy
// config reload keeps using the same Priors.
type Priors struct {
	// QualityAlpha and LatencyAlpha are the EWMA factors in (0,1]; zero
	// means the defaults.
	QualityAlpha, LatencyAlpha float64
	// DecisionTTL and DecisionCapacity bound the decision memory; zero means the defaults.
	DecisionTTL      time.Duration
	DecisionCapacity int
	// Now is the clock; nil means time.Now.
	Now func() time.Time

	mu        sync.Mutex
	values    map[recordKey]PriorRecord
	dirty     map[recordKey]bool
	store     PriorStore
	decisions map[string]*remembered
	order     []string // decision ids, oldest first
	stop      chan struct{}
	done      chan struct{}
}

type remembered struct {
	key   PriorKey
	prior float64 // the quality the decision was made with
	at    time.Time
	used  bool
}

// NewPriors returns empty priors with the default settings and no store.
func NewPriors() *Priors { return &Priors{} }

func (p *Priors) now() time.Time {
	if p.Now != nil {
		return p.Now()
	}
	return time.Now()
}

// Attach loads the records of store (learned values replace the ones in
// memory) and makes it the store later updates are saved to: quality
// updates at once, latency updates on Flush, Close and, once
// StartFlushing is called, periodically. Attaching the store already
// attached does nothing. Errors are Load's.
func (p *Priors) Attach(store PriorStore) error {
	p.mu.Lock()
	if p.store == store {
		p.mu.Unlock()
		return nil
	}
	p.mu.Unlock()
	recs, err := store.Load()
	if err != nil {
		return fmt.Errorf("loading priors: %w", err)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.values == nil {
		p.values = map[recordKey]PriorRecord{}
	}
	for _, r := range recs {
		p.values[recordKey{r.Kind, r.PriorKey}] = r
	}
	p.store = store
	return nil
}

// StartFlushing saves changed records every interval until Close; calling
// it again while it runs does nothing.
func (p *Priors) StartFlushing(every time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if every <= 0 || p.stop != nil {
		return
	}
	p.stop, p.done = make(chan struct{}), make(chan struct{})
	go p.flushLoop(every, p.stop, p.done)
}

func (p *Priors) flushLoop(every time.Duration, stop, done chan struct{}) {
	defer close(done)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
			_ = p.Flush()
		}
	}
}

// Flush saves the records changed since the last save. The periodic flush
// of Attach ignores errors (the records stay dirty and are tried again).
func (p *Priors) Flush() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.flushLocked()
}

func (p *Priors) flushLocked() error {
	if p.store == nil || len(p.dirty) == 0 {
		return nil
	}
	recs := make([]PriorRecord, 0, len(p.dirty))
	for k := range p.dirty {
		recs = append(recs, p.values[k])
	}
	if err := p.store.Save(recs); err != nil {
		return fmt.Errorf("saving priors: %w", err)
	}
	clear(p.dirty)
	return nil
}

// Close stops the flushing, saves what changed and detaches the store.
func (p *Priors) Close() error {
	p.mu.Lock()
	stop, done := p.stop, p.done
	p.stop, p.done = nil, nil
	p.mu.Unlock()
	if stop != nil {
		close(stop)
		<-done
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	err := p.flushLocked()
	p.store = nil
	return err
}

// Quality returns the learned quality for key and how many observations
// it holds, or seed and 0 when nothing was learned yet.
func (p *Priors) Quality(key PriorKey, seed float64) (q float64, n int64) {
	if p == nil {
		return seed, 0
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if r, ok := p.values[recordKey{PriorQuality, key}]; ok {
		return r.Value, r.N
	}
	return seed, 0
}

// QualityObserver takes outcome scores in [0,1] for the (target, model,
// category) that answered — explicit feedback, verifier scores, escalations
// — and returns the prior after the update. seed is the quality the
// decision was made with, used when nothing was learned yet. *Priors
// implements it.
type QualityObserver interface {
	ObserveQuality(key PriorKey, seed, score float64) (float64, error)
}

var _ QualityObserver = (*Priors)(nil)

// ObserveQuality folds score (clamped to [0,1]) into key's quality prior,
// starting from seed when nothing was learned yet, saves it, and returns
// the new value. It is how outcomes reach the priors: explicit feedback,
// verifier scores, escalations (score 0 for the answer that was escalated).
// The error is the store's; the value in memory is updated regardless.
func (p *Priors) ObserveQuality(key PriorKey, seed, score float64) (float64, error) {
	if p == nil {
		return seed, nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	v := p.observeLocked(recordKey{PriorQuality, key}, seed, min(max(score, 0), 1), p.alpha(p.QualityAlpha, DefaultQualityAlpha), false)
	return v, p.flushLocked()
}

// ObserveLatency folds one answer's time to first byte and total time
// into the target's latency EWMAs (saved on the next flush).
func (p *Priors) ObserveLatency(target string, ttfb, total time.Duration) {
	if p == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	a := p.alpha(p.LatencyAlpha, DefaultLatencyAlpha)
	p.observeLocked(recordKey{PriorTTFB, PriorKey{Target: target}}, 0, ttfb.Seconds(), a, true)
	p.observeLocked(recordKey{PriorTotal, PriorKey{Target: target}}, 0, total.Seconds(), a, true)
}

// ObserveThroughput folds one answer's generation speed — completion
// tokens over the seconds spent producing them — into the EWMA of
// (target, model). Non-positive inputs are ignored.
func (p *Priors) ObserveThroughput(target, model string, completionTokens int, gen time.Duration) {
	if p == nil || completionTokens <= 0 || gen <= 0 {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.observeLocked(recordKey{PriorTPS, PriorKey{Target: target, Model: model}}, 0,
		float64(completionTokens)/gen.Seconds(), p.alpha(p.LatencyAlpha, DefaultLatencyAlpha), true)
}

// Throughput returns the learned completion tokens per second of (target,
// model) and whether any was observed.
func (p *Priors) Throughput(target, model string) (float64, bool) {
	if p == nil {
		return 0, false
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	r, ok := p.values[recordKey{PriorTPS, PriorKey{Target: target, Model: model}}]
	return r.Value, ok
}

// Latency returns the target's learned latency in seconds — time to first
// byte for a stream, total time otherwise — and whether any was observed.
func (p *Priors) Latency(target string, stream bool) (float64, bool) {
	if p == nil {
		return 0, false
	}
	kind := PriorTotal
	if stream {
		kind = PriorTTFB
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	r, ok := p.values[recordKey{kind, PriorKey{Target: target}}]
	return r.Value, ok
}

func (p *Priors) alpha(set, def float64) float64 {
	if set > 0 && set <= 1 {
		return set
	}
	return def
}

// observeLocked: the first observation of a latency replaces the seed (the
// static prior is a guess, the observation a fact); a quality blends into its seed.
func (p *Priors) observeLocked(k recordKey, seed, x, alpha float64, firstReplaces bool) float64 {
	if p.values == nil {
		p.values = map[recordKey]PriorRecord{}
	}
	if p.dirty == nil {
		p.dirty = map[recordKey]bool{}
	}
	r, ok := p.values[k]
	switch {
	case ok:
		r.Value = (1-alpha)*r.Value + alpha*x
	case firstReplaces:
		r = PriorRecord{Kind: k.kind, PriorKey: k.PriorKey, Value: x}
	default:
		r = PriorRecord{Kind: k.kind, PriorKey: k.PriorKey, Value: (1-alpha)*seed + alpha*x}
	}
	r.N++
	r.Updated = p.now()
	p.values[k] = r
	p.dirty[k] = true
	return r.Value
}

// Remember keeps decision id → the chosen candidate's prior key and the
// quality it was chosen with, for Feedback. The oldest entries go first
// when the memory is full; entries older than the TTL are forgotten.
func (p *Priors) Remember(id string, key PriorKey, quality float64) {
	if p == nil || id == "" {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	now := p.now()
	p.expireLocked(now)
	if p.decisions == nil {
		p.decisions = map[string]*remembered{}
	}
	if _, dup := p.decisions[id]; dup {
		return
	}
	capacity := p.DecisionCapacity
	if capacity <= 0 {
		capacity = DefaultDecisionCapacity
	}
	for len(p.order) >= capacity {
		delete(p.decisions, p.order[0])
		p.order = p.order[1:]
	}
	p.decisions[id] = &remembered{key: key, prior: quality, at: now}
	p.order = append(p.order, id)
}

func (p *Priors) expireLocked(now time.Time) {
	ttl := p.DecisionTTL
	if ttl <= 0 {
		ttl = DefaultDecisionTTL
	}
	i := 0
	for ; i < len(p.order); i++ {
		d := p.decisions[p.order[i]]
		if d != nil && now.Sub(d.at) <= ttl {
			break
		}
		delete(p.decisions, p.order[i])
	}
	if i > 0 {
		// Resliced, not shifted: a shift copied every id left (10,000 by
		// default) for each one expired. The dropped prefix is freed when
		// append next grows the array.
		clear(p.order[:i])
		p.order = p.order[i:]
	}
}

// FeedbackResult says which prior a feedback score moved and where to.
type FeedbackResult struct {
	Key     PriorKey
	Quality float64 // the prior after the update
	N       int64   // observations it now holds
}

// Feedback applies an explicit score in [0,1] to the prior of the decision
// id's chosen (target, model, category). Each decision takes one feedback.
// Errors: ErrUnknownDecision, ErrFeedbackGiven, a score outside [0,1], or
// the store's error (the prior is updated in memory all the same).
func (p *Priors) Feedback(id string, score float64) (FeedbackResult, error) {
	if p == nil {
		return FeedbackResult{}, ErrUnknownDecision
	}
	if !(score >= 0 && score <= 1) {
		return FeedbackResult{}, fmt.Errorf("score %v must be in [0,1]", score)
	}
	p.mu.Lock()
	p.expireLocked(p.now())
	d, ok := p.decisions[id]
	if !ok {
		p.mu.Unlock()
		return FeedbackResult{}, ErrUnknownDecision
	}
	if d.used {
		p.mu.Unlock()
		return FeedbackResult{}, ErrFeedbackGiven
	}
	d.used = true
	key, prior := d.key, d.prior
	p.mu.Unlock()
	q, err := p.ObserveQuality(key, prior, score)
	_, n := p.Quality(key, prior)
	return FeedbackResult{Key: key, Quality: q, N: n}, err
}
