// Package observe turns what Molly does into numbers: Prometheus metrics
// read from each request's pipeline.Outcome (denials by reason, fallbacks,
// cascade escalations, redactions by type and tier, requests by model),
// from the steps that answer before the pipeline (authentication failures,
// budget and rate refusals), from policy reloads and from the T0 engine's
// state (queue, sequences, KV slots, adapters and their transitions).
package observe

import (
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/molly-gateway/molly/policies"
	"github.com/molly-gateway/molly/router/pipeline"
	"github.com/molly-gateway/molly/router/route"
)

// Metrics are the collectors of this package (names below; every counter
// ends in _total):
//
//	molly_outcomes_total{gen_ai_request_model, gen_ai_operation_name, tier, outcome}
//	    every request by the model the client asked for, the tier that answered ("" none) and its outcome label
//	molly_denials_total{code}                      policy denials by reason class (the decision's code)
//	molly_auth_failures_total{reason}              missing_key, invalid_key
//	molly_refusals_total{reason, stage}            reason budget|rate_requests|rate_tokens, stage admission|reservation
//	molly_fallbacks_total{failure, tier, target}   failed attempts another candidate was tried after
//	molly_cascade_escalations_total{from_tier, to_tier}  cascade answers judged too weak, and the tier that answered in the end
//	molly_redactions_total{type, tier}             entity values replaced before a request left for tier
//	molly_policy_reloads_total{outcome}            loaded, failed, restored (back to the serving revision)
//	molly_policy_healthy                           1 when the newest policy content is the revision serving
//	molly_policy_loaded_timestamp_seconds          when the serving revision was compiled
//	molly_engine_queue_depth                       requests waiting for a sequence
//	molly_engine_running_sequences                 sequences decoded each step (the batch width)
//	molly_engine_kv_slots_used_ratio               share of KV sequence slots in use
//	molly_engine_adapters{state}                   adapters hot, warm, cold
//	molly_engine_adapter_uses_total{adapter}       requests served by each adapter
//	molly_engine_adapter_transitions_total{from, to}  adapter state changes seen between samples
//
// Like meter.Metrics they are made once per process (DefaultMetrics) and
// registered into each Caddy config's registry, so counters survive reloads.
type Metrics struct {
	outcomes, denials, authFailures, refusals, fallbacks, escalations, redactions, reloads, transitions *prometheus.CounterVec
	healthy, loaded                                                                                     prometheus.Gauge

	mu      sync.Mutex
	engine  EngineSource
	tracker StateTracker
}

// Known label values, exported at 0 from the start so that rates and
// alerts see the series before the first event (Prometheus's
// instrumentation practice: "avoid missing metrics").
var (
	authReasons    = []string{"missing_key", "invalid_key"}
	refusalReasons = []string{"budget", "rate_requests", "rate_tokens"}
	refusalStages  = []string{"admission", "reservation"}
	reloadOutcomes = []string{"loaded", "failed", "restored"}
	denialCodes    = []string{policies.CodePolicyDenied, policies.CodeModelNotAllowed, policies.CodeToolNotAllowed,
		policies.CodeToolResultTooSensitive, policies.CodePolicyTimeout, policies.CodePolicyError}
)

// DefaultMetrics are the process's collectors.
var DefaultMetrics = NewMetrics()

// NewMetrics makes a fresh set of collectors (tests use their own).
func NewMetrics() *Metrics {
	counter := func(name, help string, labels ...string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, labels)
	}
	m := &Metrics{
		outcomes: counter("molly_outcomes_total", "Requests by the model the client asked for, operation, answering tier and outcome.",
			"gen_ai_request_model", "gen_ai_operation_name", "tier", "outcome"),
		denials:      counter("molly_denials_total", "Requests the policy denied, by the decision's code.", "code"),
		authFailures: counter("molly_auth_failures_total", "Requests refused for a missing or invalid API key.", "reason"),
		refusals:     counter("molly_refusals_total", "Requests refused for the member's budget or rate limits, at admission or at the plan's reservation.", "reason", "stage"),
		fallbacks:    counter("molly_fallbacks_total", "Failed attempts after which another candidate was tried.", "failure", "tier", "target"),
		escalations:  counter("molly_cascade_escalations_total", "Cascade answers judged too weak, by their tier and the tier whose answer was returned.", "from_tier", "to_tier"),
		redactions:   counter("molly_redactions_total", "Entity values replaced in requests before they left, by entity type and tier.", "type", "tier"),
		reloads:      counter("molly_policy_reloads_total", "Policy reload attempts by outcome: loaded, failed, restored.", "outcome"),
		transitions:  counter("molly_engine_adapter_transitions_total", "Adapter state changes seen between samples (from \"\" is a new adapter).", "from", "to"),
		healthy: prometheus.NewGauge(prometheus.GaugeOpts{Name: "molly_policy_healthy",
			Help: "1 when the newest policy content is the revision serving, 0 when the last reload failed."}),
		loaded: prometheus.NewGauge(prometheus.GaugeOpts{Name: "molly_policy_loaded_timestamp_seconds",
			Help: "Unix time the serving policy revision was compiled."}),
	}
	for _, r := range authReasons {
		m.authFailures.WithLabelValues(r)
	}
	for _, r := range refusalReasons {
		for _, st := range refusalStages {
			m.refusals.WithLabelValues(r, st)
		}
	}
	for _, o := range reloadOutcomes {
		m.reloads.WithLabelValues(o)
	}
	for _, c := range denialCodes {
		m.denials.WithLabelValues(c)
	}
	return m
}

// Register registers the collectors into reg; ones already there are kept.
func (m *Metrics) Register(reg prometheus.Registerer) error {
	for _, c := range []prometheus.Collector{m.outcomes, m.denials, m.authFailures, m.refusals, m.fallbacks, m.escalations,
		m.redactions, m.reloads, m.transitions, m.healthy, m.loaded, engineCollector{m}} {
		if err := reg.Register(c); err != nil {
			if _, ok := err.(prometheus.AlreadyRegisteredError); !ok {
				return err
			}
		}
	}
	return nil
}

// Record implements pipeline.Recorder.
func (m *Metrics) Record(o pipeline.Outcome) {
	tier := ""
	if o.Answered >= 0 && o.Answered < len(o.Attempts) {
		tier = o.Attempts[o.Answered].Tier
	}
	m.outcomes.WithLabelValues(o.Model, operation(o.Endpoint), tier, o.Label).Inc()
	if o.Label == "denied" {
		code := o.Code
		if code == "" { // a 403 of a later step under an allowing decision
			code = policies.CodePolicyDenied
		}
		m.denials.WithLabelValues(code).Inc()
	}
	for i, a := range o.Attempts {
		switch {
		case a.Failure != "" && a.Failure != "client_gone" && i+1 < len(o.Attempts):
			m.fallbacks.WithLabelValues(a.Failure, a.Tier, a.Target).Inc()
		case a.Failure == "" && !a.Delivered && o.Plan.Strategy == route.StrategyCascade:
			// an answer the cascade went past; to_tier is the answer's ("" none)
			m.escalations.WithLabelValues(a.Tier, tier).Inc()
		}
	}
	for _, t := range o.RedactedTypes {
		m.redactions.WithLabelValues(t, tier).Add(float64(o.Findings[t]))
	}
}

// operation is the GenAI operation name of an endpoint's outcome
// ("chat.completions" → "chat"), as openai.Endpoint.Operation names it.
func operation(endpoint string) string {
	switch endpoint {
	case "chat.completions":
		return "chat"
	case "completions":
		return "text_completion"
	case "embeddings":
		return "embeddings"
	}
	return endpoint
}

// AuthFailure counts a request refused for its key: reason "missing_key"
// or "invalid_key".
func (m *Metrics) AuthFailure(reason string) { m.authFailures.WithLabelValues(reason).Inc() }

// Refused counts a budget or rate refusal: reason "budget", "rate_requests"
// or "rate_tokens"; stage "admission" (before the request is read further)
// or "reservation" (the plan's worst case did not fit).
func (m *Metrics) Refused(reason, stage string) { m.refusals.WithLabelValues(reason, stage).Inc() }

// PolicyLoaded sets the policy gauges from st (at start and on every reload).
func (m *Metrics) PolicyLoaded(st policies.Status) {
	if st.Healthy {
		m.healthy.Set(1)
	} else {
		m.healthy.Set(0)
	}
	if !st.LoadedAt.IsZero() {
		m.loaded.Set(float64(st.LoadedAt.UnixNano()) / 1e9)
	}
}

// PolicyReload counts a reload attempt reported by policies.Options.OnReload:
// a new revision ("loaded"), a failure ("failed"), or the content back to
// the revision serving after a failure ("restored"); it reports what it counted.
func (m *Metrics) PolicyReload(st policies.Status, previous string) string {
	outcome := "failed"
	switch {
	case st.Healthy && st.Revision != previous:
		outcome = "loaded"
	case st.Healthy:
		outcome = "restored"
	}
	m.reloads.WithLabelValues(outcome).Inc()
	m.PolicyLoaded(st)
	return outcome
}

// SetEngine makes src the engine the engine metrics read (nil: none).
func (m *Metrics) SetEngine(src EngineSource) {
	m.mu.Lock()
	m.engine = src
	m.mu.Unlock()
}

// SampleEngine reads the engine's state and counts the adapter transitions
// since the last sample; ok is false without an engine. The app calls it
// periodically (and every scrape does), so transitions are seen at that
// resolution.
func (m *Metrics) SampleEngine() (EngineState, bool) {
	m.mu.Lock()
	src := m.engine
	m.mu.Unlock()
	if src == nil {
		return EngineState{}, false
	}
	s, ok := src()
	if !ok {
		return s, false
	}
	for _, t := range m.tracker.Observe(s.Adapters) {
		m.transitions.WithLabelValues(t.From, t.To).Inc()
	}
	return s, true
}

// SampleEvery samples the engine every period until stop is closed.
func (m *Metrics) SampleEvery(period time.Duration, stop <-chan struct{}) {
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
			m.SampleEngine()
		}
	}
}

// engineCollector exports the engine's state at scrape time.
type engineCollector struct{ m *Metrics }

var (
	descQueue    = prometheus.NewDesc("molly_engine_queue_depth", "Requests waiting for a T0 engine sequence.", nil, nil)
	descRunning  = prometheus.NewDesc("molly_engine_running_sequences", "Sequences holding KV cells, decoded each scheduler step (the batch width in sequences).", nil, nil)
	descKV       = prometheus.NewDesc("molly_engine_kv_slots_used_ratio", "Share of the engine's KV sequence slots in use.", nil, nil)
	descAdapters = prometheus.NewDesc("molly_engine_adapters", "Registered LoRA adapters by state.", []string{"state"}, nil)
	descUses     = prometheus.NewDesc("molly_engine_adapter_uses_total", "Requests served by each adapter.", []string{"adapter"}, nil)
)

func (engineCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descQueue, descRunning, descKV, descAdapters, descUses} {
		ch <- d
	}
}

func (c engineCollector) Collect(ch chan<- prometheus.Metric) {
	s, ok := c.m.SampleEngine()
	if !ok {
		return
	}
	ch <- prometheus.MustNewConstMetric(descQueue, prometheus.GaugeValue, float64(s.Queued))
	ch <- prometheus.MustNewConstMetric(descRunning, prometheus.GaugeValue, float64(s.Busy))
	ch <- prometheus.MustNewConstMetric(descKV, prometheus.GaugeValue, s.KVShare())
	count := map[string]float64{"hot": 0, "warm": 0, "cold": 0}
	for _, a := range s.Adapters {
		count[a.State]++
		ch <- prometheus.MustNewConstMetric(descUses, prometheus.CounterValue, float64(a.Uses), a.Name)
	}
	for st, n := range count {
		ch <- prometheus.MustNewConstMetric(descAdapters, prometheus.GaugeValue, n, st)
	}
}
