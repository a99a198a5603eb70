package traces

import (
	"sort"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/molly-gateway/molly/router/pipeline"
)

// servedTotal counts answered requests by task category and the tier that
// answered: the metric of the loop's claim that domains move down the
// tiers (its rate per tier over the rate per category is the share).
var servedTotal = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "molly_served_total",
	Help: "Answered requests by task category and the tier that answered."}, []string{"category", "tier"})

// Share is a pipeline.Recorder that counts answered requests per (task
// category, tier) in molly_served_total and in time buckets kept in
// memory, for the admin endpoint that shows the share of requests served
// per tier per category over time. Safe for concurrent use; Record takes
// one mutex and does no I/O.
type Share struct {
	width time.Duration
	keep  int
	now   func() time.Time

	mu      sync.Mutex
	buckets map[int64]map[shareKey]int64 // bucket start (unix seconds) → counts
}

type shareKey struct{ category, tier string }

// NewShare keeps keep buckets of width (defaults: 1h, 168 — a week).
func NewShare(width time.Duration, keep int) *Share {
	if width <= 0 {
		width = time.Hour
	}
	if keep <= 0 {
		keep = 168
	}
	return &Share{width: width, keep: keep, now: time.Now, buckets: map[int64]map[shareKey]int64{}}
}

// Record implements pipeline.Recorder: an outcome with a delivered answer
// counts for its task category and answering tier.
func (s *Share) Record(o pipeline.Outcome) {
	if o.Answered < 0 || o.Answered >= len(o.Attempts) {
		return
	}
	k := shareKey{o.Task, o.Attempts[o.Answered].Tier}
	servedTotal.WithLabelValues(k.category, k.tier).Inc()
	start := s.now().Truncate(s.width).Unix()
	s.mu.Lock()
	defer s.mu.Unlock()
	b := s.buckets[start]
	if b == nil {
		b = map[shareKey]int64{}
		s.buckets[start] = b
		oldest := start - int64(s.keep)*int64(s.width/time.Second)
		for t := range s.buckets {
			if t <= oldest {
				delete(s.buckets, t)
			}
		}
	}
	b[k]++
}

// ShareRow is one bucket's requests of one category: answered per tier,
// and each tier's share of the category's requests in the bucket.
type ShareRow struct {
	Start    time.Time          `json:"start"`
	Category string             `json:"category"`
	Requests int64              `json:"requests"`
	Tiers    map[string]int64   `json:"tiers"`
	Share    map[string]float64 `json:"share"`
}

// Rows returns every kept bucket's rows, oldest first, then by category.
func (s *Share) Rows() []ShareRow {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []ShareRow
	for start, b := range s.buckets {
		rows := map[string]*ShareRow{}
		for k, n := range b {
			r := rows[k.category]
			if r == nil {
				r = &ShareRow{Start: time.Unix(start, 0).UTC(), Category: k.category, Tiers: map[string]int64{}, Share: map[string]float64{}}
				rows[k.category] = r
			}
			r.Tiers[k.tier] += n
			r.Requests += n
		}
		for _, r := range rows {
			for t, n := range r.Tiers {
				r.Share[t] = float64(n) / float64(r.Requests)
			}
			out = append(out, *r)
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if !out[i].Start.Equal(out[j].Start) {
			return out[i].Start.Before(out[j].Start)
		}
		return out[i].Category < out[j].Category
	})
	return out
}

var _ pipeline.Recorder = (*Share)(nil)
