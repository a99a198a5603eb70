package app

import (
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/molly-gateway/molly/policies"
	"github.com/molly-gateway/molly/router/console"
	"github.com/molly-gateway/molly/router/observe"
	"github.com/molly-gateway/molly/router/pipeline"
)

// EngineSampleInterval is how often the engine's adapter states are
// sampled for molly_engine_adapter_transitions_total.
const EngineSampleInterval = time.Second

// policyRevision is the policy revision last reported to the metrics
// (process-wide, as the metrics are).
var policyRevision atomic.Pointer[string]

// recorders are the pipeline's outcome recorders: the metrics and the
// console, both process-wide (they outlive config reloads).
func (a *App) recorders() []pipeline.Recorder {
	return []pipeline.Recorder{observe.DefaultMetrics, console.Default}
}

// ConsoleSources are what the console reads from this app besides the
// recorded outcomes.
func (a *App) ConsoleSources() console.Sources {
	s := console.Sources{Catalogue: a.catalogue, Priors: a.Priors(), Policy: a.policy.Status}
	if a.engine != nil {
		s.Engine = a.EngineState
	}
	return s
}

// EngineState is the T0 engine's state as observe shows it (ok false
// without an engine). serving.Stats has no batch size in tokens nor KV
// cells in use: the running sequences and the share of sequence slots
// stand for them.
func (a *App) EngineState() (observe.EngineState, bool) {
	e := a.engine
	if e == nil {
		return observe.EngineState{}, false
	}
	st := e.Stats()
	s := observe.EngineState{Model: e.Name(), Busy: st.BusySequences, Free: st.FreeSequences, Queued: st.Queued, Steps: st.Steps}
	for _, ad := range e.Adapters() {
		s.Adapters = append(s.Adapters, observe.Adapter{Name: ad.Name, State: string(ad.State), Bytes: ad.Bytes, Uses: ad.Uses, Hits: ad.Hits, LoadTime: ad.LoadTime})
	}
	return s, true
}

// policyLoaded records the revision the policy engine started with.
func (a *App) policyLoaded() {
	st := a.policy.Status()
	policyRevision.Store(&st.Revision)
	observe.DefaultMetrics.PolicyLoaded(st)
}

// onPolicyReload is policies.Options.OnReload: it counts the reload.
func (a *App) onPolicyReload(st policies.Status) {
	prev := ""
	if p := policyRevision.Load(); p != nil {
		prev = *p
	}
	outcome := observe.DefaultMetrics.PolicyReload(st, prev)
	policyRevision.Store(&st.Revision)
	if a.logger != nil {
		a.logger.Debug("policy reload counted", zap.String("outcome", outcome), zap.String("revision", st.Revision))
	}
}

// startObserve points the engine metrics at this app's engine and samples
// its adapters' states until stopObserve.
func (a *App) startObserve() {
	if a.engine == nil {
		observe.DefaultMetrics.SetEngine(nil)
		return
	}
	observe.DefaultMetrics.SetEngine(a.EngineState)
	observe.DefaultMetrics.SampleEngine() // the adapters as registered, before any scrape
	a.sampling = make(chan struct{})
	go observe.DefaultMetrics.SampleEvery(EngineSampleInterval, a.sampling)
}

// stopObserve stops the sampling; with no app running any more, the
// engine metrics stop reading the engine.
func (a *App) stopObserve() {
	if a.sampling != nil {
		close(a.sampling)
		a.sampling = nil
	}
	if Current() == nil {
		observe.DefaultMetrics.SetEngine(nil)
	}
}
