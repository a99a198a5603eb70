package observe

import (
	"sort"
	"sync"
	"time"
)

// EngineState is a snapshot of the T0 engine as the console and the
// metrics show it, converted from serving.Engine's Stats and Adapters by
// the caller (this package does not link the engine).
type EngineState struct {
	Model string `json:"model"`
	// Busy sequences hold KV cells (the sequences decoded each step: the
	// batch width in sequences); Free are available; Queued requests wait
	// for admission. Steps counts scheduler iterations.
	Busy   int   `json:"busy"`
	Free   int   `json:"free"`
	Queued int   `json:"queued"`
	Steps  int64 `json:"steps"`
	// Adapters are the registered LoRA adapters, by name.
	Adapters []Adapter `json:"adapters"`
}

// Adapter is one registered adapter: its state (hot, warm, cold), file
// size in bytes, requests served, those of them that found it hot (Hits;
// Hits/Uses is its hit rate) and last load time.
type Adapter struct {
	Name     string        `json:"name"`
	State    string        `json:"state"`
	Bytes    int64         `json:"bytes"`
	Uses     int           `json:"uses"`
	Hits     int           `json:"hits"`
	LoadTime time.Duration `json:"load_time_ns"`
}

// KVShare is the share of KV sequence slots in use, in [0,1] (0 when the
// engine has none).
func (s EngineState) KVShare() float64 {
	if n := s.Busy + s.Free; n > 0 {
		return float64(s.Busy) / float64(n)
	}
	return 0
}

// EngineSource returns the engine's current state; ok is false when no
// engine is configured.
type EngineSource func() (s EngineState, ok bool)

// Transition is one adapter changing state between two samples.
type Transition struct {
	Adapter, From, To string
}

// StateTracker turns successive samples of the adapters' states into
// transitions (a state the adapter passed through between two samples is
// not seen: the engine reports states, not events). Safe for concurrent use.
type StateTracker struct {
	mu   sync.Mutex
	last map[string]string
}

// Observe compares adapters with the previous sample and returns the
// transitions, sorted by adapter name; an adapter seen for the first time
// counts as coming from "" (registered), one gone as going to "".
func (t *StateTracker) Observe(adapters []Adapter) []Transition {
	t.mu.Lock()
	defer t.mu.Unlock()
	now := make(map[string]string, len(adapters))
	var out []Transition
	for _, a := range adapters {
		now[a.Name] = a.State
		if prev, ok := t.last[a.Name]; !ok || prev != a.State {
			out = append(out, Transition{a.Name, prev, a.State})
		}
	}
	for name, prev := range t.last {
		if _, ok := now[name]; !ok {
			out = append(out, Transition{name, prev, ""})
		}
	}
	t.last = now
	sort.Slice(out, func(i, j int) bool { return out[i].Adapter < out[j].Adapter })
	return out
}
