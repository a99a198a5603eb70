// Package console is Molly's live console: a pipeline.Recorder that keeps
// what the page shows — the tier mix and spend per member, the last
// decisions with their reasons, plans and attempts, each target's recent
// health, and the share of each task category served on T0 over time —
// and an http.Handler serving the page (one HTML file with inline CSS and
// JavaScript, no external assets) and its JSON state, which the page polls.
//
// Nothing here holds request or answer text: a pipeline.Outcome carries
// none, and the state is built from outcomes, the catalogue, the learned
// priors, the policy status and the engine's state only.
package console

import (
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/molly-gateway/molly/policies"
	"github.com/molly-gateway/molly/router/observe"
	"github.com/molly-gateway/molly/router/pipeline"
	"github.com/molly-gateway/molly/router/route"
)

// Defaults of a Recorder.
const (
	// DefaultDecisions is how many recent decisions are kept.
	DefaultDecisions = 200
	// DefaultBucket is the width of one point of the T0-share series.
	DefaultBucket = time.Minute
	// DefaultBuckets is how many points of the series are kept (an hour).
	DefaultBuckets = 60
	// healthWindow is how many recent attempts per target judge its health.
	healthWindow = 20
)

// Recorder keeps the console's view of recent traffic. Its zero value is
// not ready: use NewRecorder. Safe for concurrent use; Record takes a lock
// for a few map updates and never blocks on I/O.
type Recorder struct {
	// Now is the clock; nil means time.Now.
	Now func() time.Time

	mu        sync.Mutex
	max       int
	bucket    time.Duration
	buckets   int
	decisions []Decision // ring, oldest overwritten
	next      int
	total     int
	tiers     map[string]int
	members   map[string]*MemberStats
	health    map[string]*targetHealth
	series    []shareBucket // oldest first
	started   time.Time
}

// NewRecorder returns a recorder keeping decisions recent decisions and
// buckets points of bucket width (zero values: the defaults).
func NewRecorder(decisions int, bucket time.Duration, buckets int) *Recorder {
	if decisions <= 0 {
		decisions = DefaultDecisions
	}
	if bucket <= 0 {
		bucket = DefaultBucket
	}
	if buckets <= 0 {
		buckets = DefaultBuckets
	}
	return &Recorder{max: decisions, bucket: bucket, buckets: buckets, tiers: map[string]int{}, members: map[string]*MemberStats{},
		health: map[string]*targetHealth{}, started: time.Now()}
}

// Default is the process's recorder: the molly app hands it every outcome,
// and it outlives config reloads.
var Default = NewRecorder(0, 0, 0)

func (r *Recorder) now() time.Time {
	if r.Now != nil {
		return r.Now()
	}
	return time.Now()
}

// Decision is one request as the console lists it.
type Decision struct {
	ID          string            `json:"id"`
	Time        time.Time         `json:"time"`
	Member      string            `json:"member"`
	Endpoint    string            `json:"endpoint"`
	Model       string            `json:"model"`
	Task        string            `json:"task"`
	Difficulty  float64           `json:"difficulty"`
	Sensitivity string            `json:"sensitivity"`
	Tiers       []string          `json:"tiers"`
	Stream      bool              `json:"stream"`
	Revision    string            `json:"revision"`
	Reasons     []string          `json:"reasons"` // the policy's
	Code        string            `json:"code,omitempty"`
	Strategy    string            `json:"strategy"`
	PlanReasons []string          `json:"plan_reasons"`
	Candidates  []Candidate       `json:"candidates"`
	Excluded    []route.Exclusion `json:"excluded"`
	Route       string            `json:"route"` // the X-Molly-Route explanation of the answer
	Attempts    []Attempt         `json:"attempts"`
	Label       string            `json:"label"`
	Status      int               `json:"status"`
	Target      string            `json:"target"`
	Tier        string            `json:"tier"`
	Adapter     string            `json:"adapter"`
	Redacted    int               `json:"redacted"`
	Redactions  map[string]int    `json:"redactions"` // entity type → values found, for the types redacted
	Findings    map[string]int    `json:"findings"`
	CostUSD     float64           `json:"cost_usd"`
	DurationMS  float64           `json:"duration_ms"`
	Reserve     route.Reservation `json:"reserve"`

	// chosen is the answer's plan candidate (Target nil for none): Route is
	// written from it when the state is read, not on the request's path.
	chosen route.Candidate
	plan   *route.Plan
}

// Candidate is one plan candidate with its score terms.
type Candidate struct {
	Target   string  `json:"target"`
	Tier     string  `json:"tier"`
	Model    string  `json:"model"`
	Quality  float64 `json:"quality"`
	Learned  int64   `json:"learned"`
	CostUSD  float64 `json:"cost_usd"`
	LatencyS float64 `json:"latency_s"`
	Score    float64 `json:"score"`
}

// Attempt is one try of a decision.
type Attempt struct {
	Target     string  `json:"target"`
	Tier       string  `json:"tier"`
	Model      string  `json:"model"`
	Adapter    string  `json:"adapter"`
	Failure    string  `json:"failure"`
	Status     int     `json:"status"`
	TTFBMS     float64 `json:"ttfb_ms"`
	TotalMS    float64 `json:"total_ms"`
	Prompt     int     `json:"prompt_tokens"`
	Completion int     `json:"completion_tokens"`
	CostUSD    float64 `json:"cost_usd"`
	Score      float64 `json:"score"`
	ScoreKind  string  `json:"score_kind"`
	Delivered  bool    `json:"delivered"`
}

// MemberStats is one member's traffic since the process started.
type MemberStats struct {
	Member   string         `json:"member"`
	Requests int            `json:"requests"`
	CostUSD  float64        `json:"cost_usd"`
	Tiers    map[string]int `json:"tiers"`
}

type targetHealth struct {
	recent      []bool // last healthWindow attempts, true = answered
	ok, failed  int
	lastFailure string
	lastAt      time.Time
}

type shareBucket struct {
	start time.Time
	cats  map[string]*[2]int // category → {served on T0, all answered}
}

// NoTier is the tier of requests no target answered.
const NoTier = "none"

// Record implements pipeline.Recorder. Model listings are not recorded.
func (r *Recorder) Record(o pipeline.Outcome) {
	if o.Endpoint == "models" {
		return // the model listing is answered from the catalogue: no decision worth a row
	}
	d := decisionOf(o)
	now := r.now()
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.decisions) < r.max {
		r.decisions = append(r.decisions, d)
	} else {
		r.decisions[r.next] = d
	}
	r.next = (r.next + 1) % r.max
	r.total++
	tier := d.Tier
	if tier == "" {
		tier = NoTier
	}
	r.tiers[tier]++
	m := r.members[d.Member]
	if m == nil {
		m = &MemberStats{Member: d.Member, Tiers: map[string]int{}}
		r.members[d.Member] = m
	}
	m.Requests++
	m.CostUSD += d.CostUSD
	m.Tiers[tier]++
	for _, a := range o.Attempts {
		if a.Failure == "client_gone" || a.Failure == "refused" {
			continue // says nothing about the target
		}
		h := r.health[a.Target]
		if h == nil {
			h = &targetHealth{}
			r.health[a.Target] = h
		}
		ok := a.Failure == ""
		h.recent = append(h.recent, ok)
		if len(h.recent) > healthWindow {
			h.recent = h.recent[1:]
		}
		if ok {
			h.ok++
		} else {
			h.failed++
			h.lastFailure = a.Failure
		}
		h.lastAt = now
	}
	if d.Tier != "" && d.Task != "" {
		b := r.bucketAt(now)
		c := b.cats[d.Task]
		if c == nil {
			c = &[2]int{}
			b.cats[d.Task] = c
		}
		if d.Tier == "T0" {
			c[0]++
		}
		c[1]++
	}
}

// bucketAt returns the series bucket holding t, adding it (and dropping
// the oldest) as needed. Caller holds mu.
func (r *Recorder) bucketAt(t time.Time) *shareBucket {
	start := t.Truncate(r.bucket)
	if n := len(r.series); n > 0 && r.series[n-1].start.Equal(start) {
		return &r.series[n-1]
	}
	r.series = append(r.series, shareBucket{start: start, cats: map[string]*[2]int{}})
	if len(r.series) > r.buckets {
		r.series = slices.Delete(r.series, 0, len(r.series)-r.buckets)
	}
	return &r.series[len(r.series)-1]
}

// decisionOf is the console's row for o.
func decisionOf(o pipeline.Outcome) Decision {
	d := Decision{ID: o.DecisionID, Time: o.Start, Member: o.Member, Endpoint: o.Endpoint, Model: o.Model, Task: o.Task,
		Difficulty: o.Difficulty, Sensitivity: o.Sensitivity, Tiers: nonNil(o.Tiers), Stream: o.Stream, Revision: o.Revision,
		Reasons: nonNil(o.Reasons), Code: o.Code, Strategy: string(o.Plan.Strategy), PlanReasons: nonNil(o.Plan.Reasons),
		Excluded: o.Plan.Excluded, Label: o.Label, Status: o.Status, Redacted: o.Redacted, Redactions: map[string]int{},
		Findings: o.Findings, DurationMS: ms(o.Duration), Reserve: o.Plan.Reserve,
		Candidates: make([]Candidate, 0, len(o.Plan.Candidates)), Attempts: make([]Attempt, 0, len(o.Attempts))}
	if d.Excluded == nil {
		d.Excluded = []route.Exclusion{}
	}
	if d.Findings == nil {
		d.Findings = map[string]int{}
	}
	for _, t := range o.RedactedTypes {
		d.Redactions[t] = o.Findings[t]
	}
	for _, c := range o.Plan.Candidates {
		d.Candidates = append(d.Candidates, Candidate{Target: c.Target.Name, Tier: c.Target.Tier, Model: c.Model, Quality: c.Quality,
			Learned: c.Learned, CostUSD: c.CostUSD, LatencyS: c.LatencyS, Score: c.Score})
	}
	for _, a := range o.Attempts {
		d.CostUSD += a.CostUSD
		d.Attempts = append(d.Attempts, Attempt{Target: a.Target, Tier: a.Tier, Model: a.Model, Adapter: a.Adapter, Failure: a.Failure,
			Status: a.Status, TTFBMS: ms(a.TTFB), TotalMS: ms(a.Total), Prompt: a.PromptTokens, Completion: a.CompletionTokens,
			CostUSD: a.CostUSD, Score: a.Score, ScoreKind: a.ScoreKind, Delivered: a.Delivered})
	}
	if o.Answered >= 0 && o.Answered < len(o.Attempts) {
		a := o.Attempts[o.Answered]
		d.Target, d.Tier, d.Adapter = a.Target, a.Tier, a.Adapter
		for _, c := range o.Plan.Candidates {
			if c.Target.Name == a.Target && c.Model == a.Model {
				d.chosen, d.plan = c, &o.Plan
				break
			}
		}
	}
	return d
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

// Sources are what the state reads besides the recorded outcomes; any may
// be nil.
type Sources struct {
	Catalogue *route.Catalogue
	Priors    *route.Priors
	Policy    func() policies.Status
	Engine    observe.EngineSource
}

// State is what the console page shows (GET <console>/state).
type State struct {
	Now       time.Time        `json:"now"`
	Since     time.Time        `json:"since"` // when recording started
	Requests  int              `json:"requests"`
	Tiers     map[string]int   `json:"tiers"` // T0..T3 and "none" → requests
	Members   []MemberStats    `json:"members"`
	Decisions []Decision       `json:"decisions"` // newest first
	Targets   []Target         `json:"targets"`
	Engine    *Engine          `json:"engine"`
	Policy    *policies.Status `json:"policy"`
	T0Share   Series           `json:"t0_share"`
}

// Target is one target with its health, latency and learned priors.
type Target struct {
	Name   string   `json:"name"`
	Tier   string   `json:"tier"`
	Kind   string   `json:"kind"`
	Region string   `json:"region"`
	Models []string `json:"models"`
	// Health is "up" (the recent attempts answered), "degraded" (some
	// failed), "down" (the last ones all failed) or "unknown" (none yet).
	Health      string  `json:"health"`
	OK          int     `json:"ok"`
	Failed      int     `json:"failed"`
	LastFailure string  `json:"last_failure"`
	LatencyS    float64 `json:"latency_s"` // learned total time, 0 when none
	TTFBS       float64 `json:"ttfb_s"`
	Priors      []Prior `json:"priors"`
}

// Prior is one learned value of a target.
type Prior struct {
	Kind     string  `json:"kind"`
	Model    string  `json:"model"`
	Category string  `json:"category"`
	Value    float64 `json:"value"`
	N        int64   `json:"n"`
}

// Engine is the T0 engine's state with each adapter's share of T0 traffic.
type Engine struct {
	observe.EngineState
	KVShare float64 `json:"kv_share"`
	// Share is, per adapter, its share of the requests served by adapters
	// (Adapter.Uses over their sum); each adapter's hit rate is its
	// Hits/Uses.
	Share map[string]float64 `json:"share"`
}

// Series is the per-category share of answered requests served on T0, one
// point per bucket.
type Series struct {
	BucketS    float64          `json:"bucket_s"`
	Categories []CategorySeries `json:"categories"`
}

// CategorySeries is one category's points.
type CategorySeries struct {
	Category string  `json:"category"`
	Points   []Point `json:"points"`
}

// Point is one bucket: its start, requests served on T0 and all answered.
type Point struct {
	T     time.Time `json:"t"`
	T0    int       `json:"t0"`
	Total int       `json:"total"`
}

// State returns the console's state, reading src for the targets, the
// engine and the policy. At most decisions recent decisions are listed.
func (r *Recorder) State(src Sources, decisions int) State {
	s := State{Now: r.now(), Tiers: map[string]int{}, Members: []MemberStats{}, Decisions: []Decision{}, Targets: []Target{}}
	health := map[string]targetHealth{}
	r.mu.Lock()
	s.Since, s.Requests = r.started, r.total
	for k, v := range r.tiers {
		s.Tiers[k] = v
	}
	for _, m := range r.members {
		c := *m
		c.Tiers = map[string]int{}
		for k, v := range m.Tiers {
			c.Tiers[k] = v
		}
		s.Members = append(s.Members, c)
	}
	for i := 0; i < len(r.decisions) && i < decisions; i++ {
		d := r.decisions[(r.next-1-i+2*len(r.decisions))%len(r.decisions)]
		if d.plan != nil {
			d.Route = route.RouteHeader(d.chosen, d.plan.Candidates, d.plan.Excluded)
		}
		s.Decisions = append(s.Decisions, d)
	}
	for k, h := range r.health {
		health[k] = targetHealth{recent: slices.Clone(h.recent), ok: h.ok, failed: h.failed, lastFailure: h.lastFailure}
	}
	s.T0Share.BucketS = r.bucket.Seconds()
	cats := map[string]*CategorySeries{}
	for _, b := range r.series {
		for cat, c := range b.cats {
			cs := cats[cat]
			if cs == nil {
				cs = &CategorySeries{Category: cat}
				cats[cat] = cs
			}
			cs.Points = append(cs.Points, Point{T: b.start, T0: c[0], Total: c[1]})
		}
	}
	r.mu.Unlock()
	s.T0Share.Categories = []CategorySeries{}
	for _, cs := range cats {
		s.T0Share.Categories = append(s.T0Share.Categories, *cs)
	}
	sort.Slice(s.T0Share.Categories, func(i, j int) bool { return s.T0Share.Categories[i].Category < s.T0Share.Categories[j].Category })
	sort.Slice(s.Members, func(i, j int) bool {
		if s.Members[i].CostUSD != s.Members[j].CostUSD {
			return s.Members[i].CostUSD > s.Members[j].CostUSD
		}
		return s.Members[i].Member < s.Members[j].Member
	})
	if src.Catalogue != nil {
		priors := map[string][]Prior{}
		for _, rec := range src.Priors.Records() {
			priors[rec.Target] = append(priors[rec.Target], Prior{Kind: rec.Kind, Model: rec.Model, Category: rec.Category, Value: rec.Value, N: rec.N})
		}
		for _, t := range src.Catalogue.Targets() {
			view := t.PolicyView()
			tv := Target{Name: t.Name, Tier: t.Tier, Kind: view["kind"].(string), Region: t.Region, Models: []string{}, Priors: priors[t.Name]}
			for _, m := range view["models"].([]any) {
				tv.Models = append(tv.Models, m.(string))
			}
			if tv.Priors == nil {
				tv.Priors = []Prior{}
			}
			tv.LatencyS, _ = src.Priors.Latency(t.Name, false)
			tv.TTFBS, _ = src.Priors.Latency(t.Name, true)
			h := health[t.Name]
			tv.OK, tv.Failed, tv.LastFailure, tv.Health = h.ok, h.failed, h.lastFailure, healthOf(h.recent)
			s.Targets = append(s.Targets, tv)
		}
	}
	if src.Policy != nil {
		st := src.Policy()
		s.Policy = &st
	}
	if src.Engine != nil {
		if es, ok := src.Engine(); ok {
			e := &Engine{EngineState: es, KVShare: es.KVShare(), Share: map[string]float64{}}
			if e.Adapters == nil {
				e.Adapters = []observe.Adapter{}
			}
			total := 0
			for _, a := range es.Adapters {
				total += a.Uses
			}
			for _, a := range es.Adapters {
				if total > 0 {
					e.Share[a.Name] = float64(a.Uses) / float64(total)
				}
			}
			s.Engine = e
		}
	}
	return s
}

// healthOf judges recent attempts (oldest first): no attempts "unknown";
// the last three (or all, if fewer) failed "down"; any failure "degraded";
// else "up".
func healthOf(recent []bool) string {
	if len(recent) == 0 {
		return "unknown"
	}
	tail := recent[max(0, len(recent)-3):]
	if !slices.Contains(tail, true) {
		return "down"
	}
	if slices.Contains(recent, false) {
		return "degraded"
	}
	return "up"
}
