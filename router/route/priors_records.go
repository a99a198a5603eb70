package route

import (
	"maps"
	"slices"
)

// Records returns every learned value (quality, latency, throughput), sorted
// by kind and key, for display: the console lists them beside the targets.
func (p *Priors) Records() []PriorRecord {
	if p == nil {
		return nil
	}
	p.mu.Lock()
	out := slices.Collect(maps.Values(p.values))
	p.mu.Unlock()
	slices.SortFunc(out, func(a, b PriorRecord) int {
		if c := compareStrings(a.Kind, b.Kind); c != 0 {
			return c
		}
		return compareStrings(a.PriorKey.String(), b.PriorKey.String())
	})
	return out
}
