package redaction

import (
	"math/rand/v2"
	"slices"
	"testing"
)

// refResolve is the oracle of resolve: the greedy choice written out, each
// candidate in the order longer, type priority, earlier, as given, kept
// when it shares a byte with no kept one (checked against each of them),
// then sorted by start.
func refResolve(prio map[string]int, cand []Finding) []Finding {
	idx := make([]int, len(cand))
	for i := range idx {
		idx[i] = i
	}
	slices.SortStableFunc(idx, func(a, b int) int {
		fa, fb := cand[a], cand[b]
		if la, lb := fa.End-fa.Start, fb.End-fb.Start; la != lb {
			return lb - la
		}
		if prio[fa.Type] != prio[fb.Type] {
			return prio[fa.Type] - prio[fb.Type]
		}
		return fa.Start - fb.Start
	})
	var kept []Finding
	for _, i := range idx {
		f := cand[i]
		free := true
		for _, k := range kept {
			if max(f.Start, k.Start) < min(f.End, k.End) {
				free = false
				break
			}
		}
		if free {
			kept = append(kept, f)
		}
	}
	slices.SortFunc(kept, func(a, b Finding) int { return a.Start - b.Start })
	return kept
}

// TestResolveMatchesReference compares resolve with refResolve on random
// candidate sets: sparse and dense, sorted and shuffled, with duplicates (the same span and type),
// nested and chained overlaps, and offsets past 2^32.
func TestResolveMatchesReference(t *testing.T) {
	s, err := NewScanner(Config{Patterns: map[string][]string{"TICKET": {`T-\d+`}}})
	if err != nil {
		t.Fatal(err)
	}
	types := append(BuiltinTypes(), "TICKET")
	rng := rand.New(rand.NewPCG(3, 4))
	for n := range 3000 {
		count := rng.IntN(40)
		span := 1 + rng.IntN(400)
		base := 0
		if n%10 == 9 {
			base = 1<<32 - 50 + rng.IntN(100)
		}
		var cand []Finding
		for range count {
			if len(cand) > 0 && rng.IntN(8) == 0 {
				d := cand[rng.IntN(len(cand))] // the same span, maybe another subtype
				d.Subtype = string(rune('a' + rng.IntN(3)))
				cand = append(cand, d)
				continue
			}
			st := base + rng.IntN(span)
			cand = append(cand, Finding{Type: types[rng.IntN(len(types))], Subtype: "a", Start: st, End: st + 1 + rng.IntN(1+rng.IntN(40))})
		}
		if n%3 == 0 {
			slices.SortFunc(cand, func(a, b Finding) int { return a.Start - b.Start })
		}
		want := refResolve(s.prio, cand)
		got := s.resolve(slices.Clone(cand))
		if !slices.Equal(got, want) {
			t.Fatalf("resolve(%v)\n got %v\nwant %v", cand, got, want)
		}
	}
}
