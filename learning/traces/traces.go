// Package traces captures consented requests for the specialisation loop:
// a pipeline.Recorder that turns each Outcome carrying trace text (the
// pipeline puts it there only for consented requests, see
// pipeline.Capture) into a registry.Trace and stores it, and the
// pipeline.Capture that decides consent.
//
// Consent: a request's X-Molly-Trace header ("on" or "off") wins; else the
// standing consent of the API key it presented; else of its member;
// default off. Standing consents live in the registry (trace_consent) and
// are cached in memory, so deciding costs a map lookup.
//
// Secrets: a trace holds the request as its answering tier saw it, so a
// request whose classifier findings (secrets, personal data) were not all
// redacted for that tier — typically one pinned to T0, where policy
// redacts nothing — is never stored: Record counts it as withheld. What
// the loop learns from therefore never holds a value the classifier found.
//
// Latency: Record never blocks the request. It offers the Outcome to a
// bounded queue and counts a drop when the queue is full; one writer
// goroutine turns queued outcomes into traces and stores up to Batch of
// them per transaction (group commit).
//
// Durability: a trace is acknowledged when its transaction has committed
// (OnStored reports it; `molly traces list` and the loop only ever see
// committed traces). The registry commits in WAL mode with
// synchronous=NORMAL by default, which keeps every committed transaction
// across a process crash (kill -9: the WAL is in the operating system's
// page cache) but not across power loss; the registry's Synchronous
// option "FULL" fsyncs each commit and survives power loss too. What is
// still queued when the process dies was never acknowledged and is lost.
package traces

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/molly-gateway/molly/registry"
	"github.com/molly-gateway/molly/router/identity"
	"github.com/molly-gateway/molly/router/pipeline"
)

// Options configure a Recorder; zero values take the defaults.
type Options struct {
	// Queue is the capacity of the queue between Record and the writer
	// (default 1024 outcomes).
	Queue int
	// Batch is the most traces stored in one transaction (default 64).
	Batch int
	// RetentionDays is how long a trace is kept when its member's consent
	// sets no retention (default 90; negative: forever). Prune applies it.
	RetentionDays int
	// OnStored, when set, is called by the writer with the decision ids of
	// each batch once committed.
	OnStored func(decisionIDs []string)
	Logger   *zap.Logger
}

// Recorder stores consented traces in the registry. Safe for concurrent use.
type Recorder struct {
	reg  *registry.Registry
	o    Options
	q    chan pipeline.Outcome
	quit chan struct{}
	done chan struct{}

	consent atomic.Pointer[consents]
	mu      sync.Mutex // serialises consent reloads

	stored, dropped, failed, withheld atomic.Int64
	idle                              chan chan struct{} // Flush waiters
}

type consents struct {
	member, key map[string]bool
	retention   map[string]int
}

// New starts a recorder writing to reg. Errors: the standing consents
// cannot be read.
func New(reg *registry.Registry, o Options) (*Recorder, error) {
	if o.Queue <= 0 {
		o.Queue = 1024
	}
	if o.Batch <= 0 {
		o.Batch = 64
	}
	if o.RetentionDays == 0 {
		o.RetentionDays = 90
	}
	if o.Logger == nil {
		o.Logger = zap.NewNop()
	}
	r := &Recorder{reg: reg, o: o, q: make(chan pipeline.Outcome, o.Queue), quit: make(chan struct{}), done: make(chan struct{}),
		idle: make(chan chan struct{})}
	if err := r.Reload(context.Background()); err != nil {
		return nil, err
	}
	go r.write()
	return r, nil
}

// Reload reads the standing consents from the registry again.
func (r *Recorder) Reload(ctx context.Context) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	cs, err := r.reg.TraceConsents(ctx)
	if err != nil {
		return err
	}
	c := &consents{member: map[string]bool{}, key: map[string]bool{}, retention: map[string]int{}}
	for _, x := range cs {
		switch x.Scope {
		case registry.ConsentMember:
			c.member[x.Name] = x.Trace
			c.retention[x.Name] = x.RetentionDays
		case registry.ConsentKey:
			c.key[x.Name] = x.Trace
		}
	}
	r.consent.Store(c)
	return nil
}

// SetConsent stores a standing consent and applies it to the next
// requests. Errors: the registry's (registry.ErrInvalid for bad values).
func (r *Recorder) SetConsent(ctx context.Context, c registry.TraceConsent) error {
	if err := r.reg.SetTraceConsent(ctx, c); err != nil {
		return err
	}
	return r.Reload(ctx)
}

// Consents implements pipeline.Capture: the X-Molly-Trace header ("on" or
// "off", any case), else the key's standing consent, else the member's;
// default off. Any other header value counts as absent.
func (r *Recorder) Consents(req *http.Request, id *identity.Identity) bool {
	switch strings.ToLower(strings.TrimSpace(req.Header.Get(pipeline.HeaderTrace))) {
	case "on":
		return true
	case "off":
		return false
	}
	c := r.consent.Load()
	if id != nil && id.KeyPrefix != "" {
		if on, ok := c.key[id.KeyPrefix]; ok {
			return on
		}
	}
	return c.member[id.Name()]
}

// Record implements pipeline.Recorder: an Outcome with trace text and an
// answer is queued for the writer; when the queue is full it is dropped
// and counted. One with findings not redacted for its answering tier is
// withheld (counted, never stored). It never blocks.
func (r *Recorder) Record(o pipeline.Outcome) {
	if o.Text == nil || o.Answered < 0 || o.Answered >= len(o.Attempts) {
		return
	}
	for t, n := range o.Findings {
		if n > 0 && !slices.Contains(o.RedactedTypes, t) {
			r.withheld.Add(1)
			withheldTotal.Inc()
			return
		}
	}
	select {
	case r.q <- o:
	default:
		r.dropped.Add(1)
		dropsTotal.Inc()
	}
}

// Stats are the recorder's counters.
type Stats struct {
	Stored, Dropped, Failed int64
	// Withheld: consented outcomes not stored because their text held
	// findings not redacted for the answering tier.
	Withheld int64
	Queued   int
}

// Stats returns the counters so far.
func (r *Recorder) Stats() Stats {
	return Stats{Stored: r.stored.Load(), Dropped: r.dropped.Load(), Failed: r.failed.Load(), Withheld: r.withheld.Load(), Queued: len(r.q)}
}

// Flush waits until everything queued before the call is stored (or
// failed), or ctx ends.
func (r *Recorder) Flush(ctx context.Context) error {
	ch := make(chan struct{})
	select {
	case r.idle <- ch:
	case <-r.done:
		return errors.New("recorder closed")
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Close stores what is queued and stops the writer.
func (r *Recorder) Close() error {
	select {
	case <-r.quit:
	default:
		close(r.quit)
	}
	<-r.done
	return nil
}

// write is the writer goroutine: it stores batches until Close, then
// drains the queue.
func (r *Recorder) write() {
	defer close(r.done)
	batch := make([]pipeline.Outcome, 0, r.o.Batch)
	for {
		select {
		case o := <-r.q:
			batch = append(batch[:0], o)
			for len(batch) < r.o.Batch {
				select {
				case o := <-r.q:
					batch = append(batch, o)
					continue
				default:
				}
				break
			}
			r.store(batch)
		case ch := <-r.idle:
			for len(r.q) > 0 {
				batch = batch[:0]
				for len(batch) < r.o.Batch && len(r.q) > 0 {
					batch = append(batch, <-r.q)
				}
				r.store(batch)
			}
			close(ch)
		case <-r.quit:
			for len(r.q) > 0 {
				batch = batch[:0]
				for len(batch) < r.o.Batch && len(r.q) > 0 {
					batch = append(batch, <-r.q)
				}
				r.store(batch)
			}
			return
		}
	}
}

func (r *Recorder) store(batch []pipeline.Outcome) {
	ts := make([]registry.Trace, len(batch))
	ids := make([]string, len(batch))
	for i, o := range batch {
		ts[i] = FromOutcome(o)
		ids[i] = o.DecisionID
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := r.reg.PutTraces(ctx, ts); err != nil {
		r.failed.Add(int64(len(batch)))
		failedTotal.Add(float64(len(batch)))
		r.o.Logger.Error("storing traces failed", zap.Int("traces", len(batch)), zap.Error(err))
		return
	}
	r.stored.Add(int64(len(batch)))
	storedTotal.Add(float64(len(batch)))
	if r.o.OnStored != nil {
		r.o.OnStored(ids)
	}
}

// Prune deletes traces past their retention (Options.RetentionDays unless
// the member's consent sets its own) and returns how many went.
func (r *Recorder) Prune(ctx context.Context, now time.Time) (int, error) {
	return r.reg.PruneTraces(ctx, now, r.o.RetentionDays)
}

// routeRecord is the route of a trace as stored (no text).
type routeRecord struct {
	Candidates []string        `json:"candidates"`
	Attempts   []attemptRecord `json:"attempts"`
}

type attemptRecord struct {
	Target    string  `json:"target"`
	Tier      string  `json:"tier"`
	Model     string  `json:"model"`
	Adapter   string  `json:"adapter,omitempty"`
	Failure   string  `json:"failure,omitempty"`
	Score     float64 `json:"score"`
	ScoreKind string  `json:"score_kind"`
	Delivered bool    `json:"delivered"`
}

// FromOutcome is the trace of a consented Outcome (o.Text set, o.Answered
// an attempt): the answered attempt's tier, target, model and score, the
// number of answers escalated away from before it (attempts that answered
// but were not delivered), the plan's candidates and every attempt.
func FromOutcome(o pipeline.Outcome) registry.Trace {
	ans := o.Attempts[o.Answered]
	rr := routeRecord{}
	for _, c := range o.Plan.Candidates {
		rr.Candidates = append(rr.Candidates, c.Label())
	}
	esc := 0
	for i, a := range o.Attempts {
		rr.Attempts = append(rr.Attempts, attemptRecord{Target: a.Target, Tier: a.Tier, Model: a.Model, Adapter: a.Adapter,
			Failure: a.Failure, Score: a.Score, ScoreKind: a.ScoreKind, Delivered: a.Delivered})
		if i < o.Answered && a.Failure == "" && !a.Delivered {
			esc++
		}
	}
	route, _ := json.Marshal(rr)
	return registry.Trace{DecisionID: o.DecisionID, Member: o.Member, Category: o.Task, Model: o.Model, Label: o.Label,
		Strategy: string(o.Plan.Strategy), Route: string(route), Tier: ans.Tier, Target: ans.Target, ServedModel: ans.Model,
		Request: string(o.Text.Request), Answer: string(o.Text.Answer), Escalations: esc, Score: ans.Score, ScoreKind: ans.ScoreKind,
		Feedback: -1, Created: o.Start}
}

// Metrics of trace capture (process-wide, registered by the molly app).
var (
	storedTotal = prometheus.NewCounter(prometheus.CounterOpts{Name: "molly_traces_stored_total",
		Help: "Consented traces committed to the registry."})
	dropsTotal = prometheus.NewCounter(prometheus.CounterOpts{Name: "molly_traces_dropped_total",
		Help: "Consented traces dropped because the capture queue was full."})
	failedTotal = prometheus.NewCounter(prometheus.CounterOpts{Name: "molly_traces_failed_total",
		Help: "Consented traces the registry failed to store."})
	withheldTotal = prometheus.NewCounter(prometheus.CounterOpts{Name: "molly_traces_withheld_total",
		Help: "Consented traces not stored because they held findings not redacted for the answering tier."})
)

// Collectors are the capture metrics, for a Prometheus registry.
func Collectors() []prometheus.Collector {
	return []prometheus.Collector{storedTotal, dropsTotal, failedTotal, withheldTotal, servedTotal}
}

var (
	_ pipeline.Recorder = (*Recorder)(nil)
	_ pipeline.Capture  = (*Recorder)(nil)
)
