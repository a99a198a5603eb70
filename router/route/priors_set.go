package route

import "fmt"

// SetQuality replaces key's quality prior with q (in [0,1]) counted as n
// observations (at least 1), and saves it. It is how an evaluation sets a
// prior outright — a promoted adapter's held-out score — where
// ObserveQuality would blend one observation into the EWMA; later
// observations blend into the set value as usual. Errors: q outside
// [0,1]; the store's (the value in memory is set regardless).
func (p *Priors) SetQuality(key PriorKey, q float64, n int64) error {
	if !(q >= 0 && q <= 1) {
		return fmt.Errorf("quality %v must be in [0,1]", q)
	}
	if p == nil {
		return nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.values == nil {
		p.values = map[recordKey]PriorRecord{}
	}
	if p.dirty == nil {
		p.dirty = map[recordKey]bool{}
	}
	k := recordKey{PriorQuality, key}
	p.values[k] = PriorRecord{Kind: PriorQuality, PriorKey: key, Value: q, N: max(n, 1), Updated: p.now()}
	p.dirty[k] = true
	return p.flushLocked()
}
