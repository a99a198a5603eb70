package serving

import (
	"time"
)

// cachedPrefix is the prompt whose KV a free sequence still holds.
type cachedPrefix struct {
	key      *adapterEntry // adapter version (nil: base)
	tokens   []int32
	split    int // the first split tokens were computed by the base model (alora.go)
	lastUsed time.Time
}

// reloadCost is the expected cost of evicting cp, in the units of
// adapterEntry.reloadCost: a prefix is worth its recompute time (tokens ×
// the measured seconds per token) discounted by age; a prefix cached under a
// retired adapter version can never be reused. Caller holds the adapter
// manager's mu.
func (cp *cachedPrefix) reloadCost(now time.Time, tokCost float64) float64 {
	if cp.key != nil && cp.key.retired {
		return 0
	}
	return float64(len(cp.tokens)) * tokCost / (1 + now.Sub(cp.lastUsed).Seconds())
}

func (e *Engine) cachedLen(id int) int {
	if cp := e.cached[id]; cp != nil && id >= 0 {
		return len(cp.tokens)
	}
	return 0
}

// dropCached frees the cells of the prefix cached in free sequence id.
func (e *Engine) dropCached(id int) {
	if cp := e.cached[id]; cp != nil {
		e.lctx.SeqRm(id, 0, -1)
		e.kvCached.Add(-int64(len(cp.tokens)))
		delete(e.cached, id)
	}
}

// makeRoom makes the memory budget hold cells more KV cells and adapter more
// bytes of hot adapter tensors, and the KV cache hold the cells: it evicts
// cached prefixes (except the one in sequence keepSeq) and hot adapters no
// request uses (except keep), lowest expected reload cost first, until both
// fit. It reports whether they fit; when they cannot, nothing in use was
// touched and the caller waits for running requests to finish. Scheduler
// goroutine only.
func (e *Engine) makeRoom(cells int, adapter int64, keep *adapterEntry, keepSeq int) bool {
	am := e.adapters
	for {
		am.mu.Lock()
		hot := am.hotBytes()
		am.mu.Unlock()
		inUse := e.kvReserved.Load() + e.kvCached.Load() + int64(cells)
		used := inUse*e.cellBytes + hot + adapter
		cellsFit := inUse <= int64(e.nCells)
		if used <= e.budget && cellsFit {
			return true
		}
		now := time.Now()
		bestSeq, bestCost := -1, 0.0
		am.mu.Lock() // retired is written under it
		for id, cp := range e.cached {
			if id == keepSeq {
				continue
			}
			if c := cp.reloadCost(now, e.tokCost); bestSeq < 0 || c < bestCost {
				bestSeq, bestCost = id, c
			}
		}
		am.mu.Unlock()
		var bestAdapter *adapterEntry
		if cellsFit { // only bytes are short: adapters can help too
			am.mu.Lock()
			v := am.victim(func(x *adapterEntry) bool { return x.hot != nil && x.pins == 0 && x != keep })
			if v != nil && (bestSeq < 0 || v.reloadCost(now) < bestCost) {
				bestAdapter = v
				am.demote(v)
				am.evictions++
			}
			am.mu.Unlock()
		}
		switch {
		case bestAdapter != nil:
		case bestSeq >= 0:
			e.dropCached(bestSeq)
			e.prefixEvictions.Add(1)
		default:
			return false
		}
	}
}

// MemoryStats is how the engine's memory budget is used, in bytes and KV
// cells (one cell holds one token's keys and values for every layer).
type MemoryStats struct {
	BudgetBytes     int64 `json:"budget_bytes"`      // Config.MemoryBytes
	KVCellBytes     int64 `json:"kv_cell_bytes"`     // bytes per cell
	KVCells         int   `json:"kv_cells"`          // cells in the KV cache
	KVReservedCells int   `json:"kv_reserved_cells"` // held by running requests (prompt plus the completion's room)
	KVCachedCells   int   `json:"kv_cached_cells"`   // held by the prefix cache
	KVBytes         int64 `json:"kv_bytes"`          // (reserved + cached) × cell bytes
	HotAdapterBytes int64 `json:"hot_adapter_bytes"` // resident adapter tensors
	HotAdapters     int   `json:"hot_adapters"`
	HotBudgetBytes  int64 `json:"hot_budget_bytes"` // Config.HotBytes, a cap within the budget
	WarmBytes       int64 `json:"warm_bytes"`       // adapter file bytes kept in memory (own budget)
	AdapterLoads    int64 `json:"adapter_loads"`    // versions made hot so far
	// AdapterEvictions and PrefixEvictions count hot adapters demoted and
	// cached prefixes dropped to make room.
	AdapterEvictions int64 `json:"adapter_evictions"`
	PrefixEvictions  int64 `json:"prefix_evictions"`
	// RetiredVersions are replaced or removed adapter versions still held
	// by running requests.
	RetiredVersions int `json:"retired_versions"`
}

// memory reports the memory use now.
func (e *Engine) memory() MemoryStats {
	reserved, cached := e.kvReserved.Load(), e.kvCached.Load()
	am := e.adapters
	am.mu.Lock()
	defer am.mu.Unlock()
	m := MemoryStats{
		BudgetBytes: e.budget, KVCellBytes: e.cellBytes, KVCells: e.nCells,
		KVReservedCells: int(reserved), KVCachedCells: int(cached), KVBytes: (reserved + cached) * e.cellBytes,
		HotAdapterBytes: am.hotBytes(), HotBudgetBytes: am.hotBudget, WarmBytes: am.warmBytes(),
		AdapterLoads: am.loads, AdapterEvictions: am.evictions, PrefixEvictions: e.prefixEvictions.Load(),
		RetiredVersions: len(am.retired),
	}
	am.all(func(x *adapterEntry) {
		if x.hot != nil {
			m.HotAdapters++
		}
	})
	return m
}

// Stats is a snapshot of the scheduler's load and memory.
type Stats struct {
	BusySequences int         `json:"busy_sequences"` // sequences holding KV cells
	FreeSequences int         `json:"free_sequences"` // sequences available
	Queued        int         `json:"queued"`         // requests waiting for admission
	Steps         int64       `json:"steps"`          // scheduler iterations so far
	GraphReuses   int64       `json:"graph_reuses"`   // steps that reused the previous compute graph
	Memory        MemoryStats `json:"memory"`
	// WatchError is why the adapter files are not watched ("" when they
	// are); a rescan still finds changes.
	WatchError string `json:"watch_error,omitempty"`
}

// Stats reports the scheduler's load and memory use.
func (e *Engine) Stats() Stats {
	e.mu.Lock()
	queued := len(e.pending)
	e.mu.Unlock()
	b := int(e.busy.Load())
	return Stats{
		BusySequences: b, FreeSequences: e.cfg.NSeqMax - b, Queued: queued, Steps: e.steps.Load(),
		GraphReuses: e.graphReuses.Load(), Memory: e.memory(), WatchError: e.watch.errString(),
	}
}
