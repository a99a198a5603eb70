// Package meter records what requests consume: the usage of each answer
// (reported by the upstream or counted), written to the caller's ledger
// before the answer is acknowledged, and the Prometheus metrics.
package meter

import (
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/molly-gateway/molly/router/classify"
	"github.com/molly-gateway/molly/router/route"
)

// Metrics are the router's Prometheus collectors. Names follow the
// OpenTelemetry semantic conventions for generative AI client metrics
// (https://opentelemetry.io/docs/specs/semconv/gen-ai/gen-ai-metrics/)
// where one exists, translated to Prometheus as the OTel-Prometheus
// compatibility spec says (dots to underscores, unit suffix):
//
//	gen_ai_client_operation_duration_seconds  histogram  gen_ai.client.operation.duration
//	gen_ai_client_token_usage                 histogram  gen_ai.client.token.usage, gen_ai_token_type input|output
//	molly_requests_total                      counter    requests by decision
//	molly_cost_usd_total                      counter    usage × the target's prices, USD
//	molly_time_to_first_byte_seconds          histogram  upstream answer headers, per target
//	molly_stream_malformed_events_total       counter    upstream stream events not passed on, per target and reason
//	molly_completion_over_cap_total           counter    answers that ran past the completion cap Molly reserved and sent, per target and reason
//
// Labels: gen_ai_operation_name (chat, text_completion, embeddings),
// gen_ai_request_model (the model name the client asked for, on the two
// gen_ai_client_* histograms as the conventions list it), tier,
// target, adapter (the T0 adapter, "" for none), category (the task) and
// decision: routed (the first choice answered), fallback (a later
// candidate answered), escalated (a cascade returned a later attempt's
// answer, cascade.go), mixture (the fused best of parallel answers,
// mixture.go), upstream_error (the answer was a 4xx), truncated
// (a stream that broke off), failed
// (every candidate failed), no_target (none allowed), client_closed
// (the client went away: 499),
// model_not_found (404), bad_request (an invalid X-Molly-* header: 400).
// Requests that reached no target have empty tier, target and adapter.
// Answers obtained but not returned (escalated cascade attempts, mixture
// members that lost) add their tokens and cost, not a request.
//
// The collectors are made once per process (DefaultMetrics) and registered
// into each Caddy config's registry, so counters survive config reloads.
type Metrics struct {
	requests *prometheus.CounterVec
	duration *prometheus.HistogramVec
	tokens   *prometheus.HistogramVec
	cost     *prometheus.CounterVec
	ttfb     *prometheus.HistogramVec
	bad      *prometheus.CounterVec
	overCap  *prometheus.CounterVec

	// served holds Served's collectors by label tuple, read without a
	// lock (a map replaced whole, under grow, when a tuple is new), so
	// that an answer costs one map look-up instead of a label look-up
	// (hash and lock) in each of six vectors.
	served atomic.Pointer[map[servedKey]*servedSet]
	grow   sync.Mutex
}

// servedKey is the label tuple of one Served call, and which token
// counts it observes (the token and cost series exist only once one is
// observed, as with WithLabelValues at each call).
type servedKey struct {
	op, model, tier, target, adapter, category, decision string
	prompt, completion                                   bool
}

// servedSet is the collectors Served observes for one servedKey (the
// token and cost ones nil when the key observes no count).
type servedSet struct {
	requests           prometheus.Counter
	duration, ttfb     prometheus.Observer
	prompt, completion prometheus.Observer
	cost               prometheus.Counter
}

// DefaultMetrics are the process's collectors.
var DefaultMetrics = NewMetrics()

// NewMetrics makes a fresh set of collectors (tests use their own).
func NewMetrics() *Metrics {
	return &Metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "molly_requests_total", Help: "Routed requests by tier, target, adapter, task category and decision.",
		}, []string{"tier", "target", "adapter", "category", "decision"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "gen_ai_client_operation_duration_seconds", Help: "GenAI operation duration as Molly's clients see it, request to last byte.",
			// The buckets the OTel GenAI conventions advise for this metric.
			Buckets: []float64{0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92},
		}, []string{"gen_ai_operation_name", "gen_ai_request_model", "tier", "target", "adapter", "category", "decision"}),
		tokens: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "gen_ai_client_token_usage", Help: "Tokens per request, input (prompt) and output (completion).",
			Buckets: []float64{1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216, 67108864},
		}, []string{"gen_ai_operation_name", "gen_ai_request_model", "gen_ai_token_type", "tier", "target", "adapter", "category"}),
		cost: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "molly_cost_usd_total", Help: "Cost of answered requests in USD: tokens × the target's prices.",
		}, []string{"tier", "target", "adapter", "category"}),
		ttfb: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "molly_time_to_first_byte_seconds", Help: "Time from sending a request upstream to its answer's headers.",
			Buckets: []float64{0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24},
		}, []string{"tier", "target"}),
		bad: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "molly_stream_malformed_events_total", Help: "Upstream stream events Molly could not pass on: not JSON, a line over the length limit.",
		}, []string{"target", "reason"}),
		overCap: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "molly_completion_over_cap_total",
			Help: "Answers whose completion ran past the max_tokens Molly reserved and sent upstream: reported (the upstream billed more), cut (a stream Molly ended), estimated (a whole answer without usage, billed at the cap).",
		}, []string{"target", "reason"}),
	}
}

// Collectors returns every collector, for registering.
func (m *Metrics) Collectors() []prometheus.Collector {
	return []prometheus.Collector{m.requests, m.duration, m.tokens, m.cost, m.ttfb, m.bad, m.overCap}
}

// Register registers the collectors into reg; ones already there are kept.
func (m *Metrics) Register(reg prometheus.Registerer) error {
	for _, c := range m.Collectors() {
		if err := reg.Register(c); err != nil {
			if _, ok := err.(prometheus.AlreadyRegisteredError); !ok {
				return err
			}
		}
	}
	return nil
}

// Unrouted counts a request that reached no target.
func (m *Metrics) Unrouted(a *classify.Annotation, decision string) {
	if m == nil {
		return
	}
	m.requests.WithLabelValues("", "", "", a.Task(), decision).Inc()
}

// Served records one answered request. prompt and completion are token
// counts (negative: unknown, not observed).
func (m *Metrics) Served(a *classify.Annotation, c route.Candidate, decision string, seconds, ttfb float64, prompt, completion int) {
	if m == nil {
		return
	}
	t := c.Target
	set := m.servedSet(servedKey{op: a.Endpoint().Operation(), model: a.Model(), tier: t.Tier, target: t.Name, adapter: c.Adapter(),
		category: a.Task(), decision: decision, prompt: prompt >= 0, completion: completion >= 0})
	set.requests.Inc()
	set.duration.Observe(seconds)
	set.ttfb.Observe(ttfb)
	if prompt >= 0 {
		set.prompt.Observe(float64(prompt))
	}
	if completion >= 0 {
		set.completion.Observe(float64(completion))
	}
	if prompt >= 0 || completion >= 0 {
		set.cost.Add(t.Cost(max(prompt, 0), max(completion, 0)))
	}
}

// servedSet returns the collectors of k, made (by WithLabelValues, which
// creates the series) the first time k is seen.
func (m *Metrics) servedSet(k servedKey) *servedSet {
	if sets := m.served.Load(); sets != nil {
		if s := (*sets)[k]; s != nil {
			return s
		}
	}
	m.grow.Lock()
	defer m.grow.Unlock()
	old := m.served.Load()
	if old != nil {
		if s := (*old)[k]; s != nil {
			return s
		}
	}
	s := &servedSet{
		requests: m.requests.WithLabelValues(k.tier, k.target, k.adapter, k.category, k.decision),
		duration: m.duration.WithLabelValues(k.op, k.model, k.tier, k.target, k.adapter, k.category, k.decision),
		ttfb:     m.ttfb.WithLabelValues(k.tier, k.target),
	}
	if k.prompt {
		s.prompt = m.tokens.WithLabelValues(k.op, k.model, "input", k.tier, k.target, k.adapter, k.category)
	}
	if k.completion {
		s.completion = m.tokens.WithLabelValues(k.op, k.model, "output", k.tier, k.target, k.adapter, k.category)
	}
	if k.prompt || k.completion {
		s.cost = m.cost.WithLabelValues(k.tier, k.target, k.adapter, k.category)
	}
	sets := make(map[servedKey]*servedSet, 1+len(ptrMap(old)))
	for key, v := range ptrMap(old) {
		sets[key] = v
	}
	sets[k] = s
	m.served.Store(&sets)
	return s
}

// ptrMap is *p, nil for a nil p.
func ptrMap(p *map[servedKey]*servedSet) map[servedKey]*servedSet {
	if p == nil {
		return nil
	}
	return *p
}

// Spent counts the tokens and cost of an answer that was obtained but not
// returned (an escalated cascade attempt, a losing mixture member); the
// request itself is counted once, with the answer that was returned.
func (m *Metrics) Spent(a *classify.Annotation, c route.Candidate, prompt, completion int) {
	if m == nil {
		return
	}
	t, ad, op := c.Target, c.Adapter(), a.Endpoint().Operation()
	m.tokens.WithLabelValues(op, a.Model(), "input", t.Tier, t.Name, ad, a.Task()).Observe(float64(prompt))
	m.tokens.WithLabelValues(op, a.Model(), "output", t.Tier, t.Name, ad, a.Task()).Observe(float64(completion))
	m.cost.WithLabelValues(t.Tier, t.Name, ad, a.Task()).Add(t.Cost(prompt, completion))
}

// Malformed counts an upstream stream event of target that was not passed
// on; reason is "not_json" or "line_too_long".
func (m *Metrics) Malformed(target, reason string) {
	if m == nil {
		return
	}
	m.bad.WithLabelValues(target, reason).Inc()
}

// OverCap counts an answer of target whose completion ran past the cap
// Molly reserved and sent upstream (Options.CompletionCap); reason is
// "reported" (the upstream's usage says it generated more: billed as
// reported), "cut" (a stream the relay ended at the cap) or "estimated" (a
// whole answer without usage whose text is well over the cap).
func (m *Metrics) OverCap(target, reason string) {
	if m == nil {
		return
	}
	m.overCap.WithLabelValues(target, reason).Inc()
}
