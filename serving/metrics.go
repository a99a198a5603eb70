package serving

import (
	"github.com/prometheus/client_golang/prometheus"
)

// Engine metrics, read from Stats at each scrape:
//
//	molly_engine_memory_budget_bytes     gauge    Config.MemoryBytes
//	molly_engine_kv_bytes                gauge    kind=reserved|cached: KV cells × cell bytes
//	molly_engine_adapter_bytes           gauge    state=hot (resident tensors, in the budget) | warm (file bytes)
//	molly_engine_hot_adapters            gauge    adapter versions hot
//	molly_engine_adapter_loads_total     counter  versions made hot
//	molly_engine_evictions_total         counter  kind=adapter|prefix, evicted to make room
//	molly_engine_retired_versions        gauge    replaced or removed versions still running
//	molly_engine_sequences               gauge    state=busy|free
//	molly_engine_queued_requests         gauge    requests waiting for admission
//	molly_engine_steps_total             counter  scheduler steps (one llama_decode each)
//	molly_engine_graph_reuses_total      counter  steps that reused the previous compute graph
//	molly_engine_speculative_rounds_total          counter  local speculative verifications (SpeculativeStats)
//	molly_engine_speculative_tokens_total          counter  kind=proposed|accepted draft tokens
//	molly_engine_remote_draft_requests_total       counter  outcome=drafted|declined (RemoteDraftStats)
//	molly_engine_remote_draft_rounds_total         counter  verify calls to remote engines
//	molly_engine_remote_draft_tokens_total         counter  kind=proposed|accepted draft tokens
//	molly_engine_verify_calls_total                counter  drafts this engine verified (VerifyStats)
//	molly_engine_verify_tokens_total               counter  kind=proposed|accepted draft tokens verified
var (
	mBudget      = prometheus.NewDesc("molly_engine_memory_budget_bytes", "The memory budget KV cells and hot adapters draw from.", nil, nil)
	mKV          = prometheus.NewDesc("molly_engine_kv_bytes", "KV cache bytes in use, by holder: running requests (reserved) or the prefix cache (cached).", []string{"kind"}, nil)
	mAdapter     = prometheus.NewDesc("molly_engine_adapter_bytes", "Adapter bytes in memory: hot (resident tensors, in the budget) or warm (file bytes).", []string{"state"}, nil)
	mHot         = prometheus.NewDesc("molly_engine_hot_adapters", "Adapter versions that are hot.", nil, nil)
	mLoads       = prometheus.NewDesc("molly_engine_adapter_loads_total", "Adapter versions made hot.", nil, nil)
	mEvict       = prometheus.NewDesc("molly_engine_evictions_total", "Hot adapters and cached prefixes evicted to make room.", []string{"kind"}, nil)
	mRetired     = prometheus.NewDesc("molly_engine_retired_versions", "Replaced or removed adapter versions that running requests still use.", nil, nil)
	mSeqs        = prometheus.NewDesc("molly_engine_sequences", "Sequences by state.", []string{"state"}, nil)
	mQueued      = prometheus.NewDesc("molly_engine_queued_requests", "Requests waiting for admission.", nil, nil)
	mSteps       = prometheus.NewDesc("molly_engine_steps_total", "Scheduler steps, one llama_decode each.", nil, nil)
	mReuses      = prometheus.NewDesc("molly_engine_graph_reuses_total", "Steps that reused the previous compute graph.", nil, nil)
	mSpecRounds  = prometheus.NewDesc("molly_engine_speculative_rounds_total", "Verification decodes of local speculative decoding, each committing its accepted draft tokens plus one.", nil, nil)
	mSpecTokens  = prometheus.NewDesc("molly_engine_speculative_tokens_total", "Draft tokens of local speculative decoding: proposed, or accepted by the target.", []string{"kind"}, nil)
	mDraftReqs   = prometheus.NewDesc("molly_engine_remote_draft_requests_total", "Requests for a remote engine answered by drafting (drafted) or sent as usual (declined).", []string{"outcome"}, nil)
	mDraftRounds = prometheus.NewDesc("molly_engine_remote_draft_rounds_total", "Verify calls to remote engines, each committing the accepted draft tokens plus one.", nil, nil)
	mDraftTokens = prometheus.NewDesc("molly_engine_remote_draft_tokens_total", "Tokens drafted for remote engines: proposed, or accepted by the remote.", []string{"kind"}, nil)
	mVerifyCalls = prometheus.NewDesc("molly_engine_verify_calls_total", "Drafts this engine verified for drafting engines (POST /molly/engine/verify).", nil, nil)
	mVerifyToks  = prometheus.NewDesc("molly_engine_verify_tokens_total", "Draft tokens this engine verified: proposed, or accepted.", []string{"kind"}, nil)
	engineAll    = []*prometheus.Desc{mBudget, mKV, mAdapter, mHot, mLoads, mEvict, mRetired, mSeqs, mQueued, mSteps, mReuses,
		mSpecRounds, mSpecTokens, mDraftReqs, mDraftRounds, mDraftTokens, mVerifyCalls, mVerifyToks}
)

// Collector returns the engine's Prometheus collector (the metrics above).
func (e *Engine) Collector() prometheus.Collector { return engineCollector{e} }

type engineCollector struct{ e *Engine }

func (c engineCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range engineAll {
		ch <- d
	}
}

func (c engineCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.e.Stats()
	m := s.Memory
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	counter := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, v, labels...)
	}
	gauge(mBudget, float64(m.BudgetBytes))
	gauge(mKV, float64(int64(m.KVReservedCells)*m.KVCellBytes), "reserved")
	gauge(mKV, float64(int64(m.KVCachedCells)*m.KVCellBytes), "cached")
	gauge(mAdapter, float64(m.HotAdapterBytes), "hot")
	gauge(mAdapter, float64(m.WarmBytes), "warm")
	gauge(mHot, float64(m.HotAdapters))
	counter(mLoads, float64(m.AdapterLoads))
	counter(mEvict, float64(m.AdapterEvictions), "adapter")
	counter(mEvict, float64(m.PrefixEvictions), "prefix")
	gauge(mRetired, float64(m.RetiredVersions))
	gauge(mSeqs, float64(s.BusySequences), "busy")
	gauge(mSeqs, float64(s.FreeSequences), "free")
	gauge(mQueued, float64(s.Queued))
	counter(mSteps, float64(s.Steps))
	counter(mReuses, float64(s.GraphReuses))
	sp := c.e.SpeculativeStats()
	counter(mSpecRounds, float64(sp.Rounds))
	counter(mSpecTokens, float64(sp.Proposed), "proposed")
	counter(mSpecTokens, float64(sp.Accepted), "accepted")
	rd := c.e.RemoteDraftStats()
	counter(mDraftReqs, float64(rd.Requests), "drafted")
	counter(mDraftReqs, float64(rd.Declined), "declined")
	counter(mDraftRounds, float64(rd.Rounds))
	counter(mDraftTokens, float64(rd.Proposed), "proposed")
	counter(mDraftTokens, float64(rd.Accepted), "accepted")
	vs := c.e.VerifyStats()
	counter(mVerifyCalls, float64(vs.Calls))
	counter(mVerifyToks, float64(vs.Proposed), "proposed")
	counter(mVerifyToks, float64(vs.Accepted), "accepted")
}
