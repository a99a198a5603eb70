package serving

import (
	"math"
	"math/rand/v2"
	"testing"
)

func TestHoldBackKeepsPossibleStopPrefixesAndPartialCharacters(t *testing.T) {
	cases := []struct {
		name  string
		text  string
		stops []string
		want  int
	}{
		{"a suffix that starts a stop string is held", "hello wor", []string{"world"}, 3},
		{"the longest such suffix wins", "say ababa", []string{"abab", "bx"}, 3},
		{"text unrelated to the stops is shown", "abc", []string{"x"}, 0},
		{"an incomplete UTF-8 character is held", "ab\xe2\x82", nil, 2},
		{"a complete UTF-8 character is shown", "ab\xe2\x82\xac", nil, 0},
		{"a partial character before a held stop prefix is held too", "a\xc3x", []string{"xy"}, 2},
	}
	for _, tc := range cases {
		if got := holdBack([]byte(tc.text), tc.stops); got != tc.want {
			t.Errorf("%s: holdBack(%q, %q) = %d, want %d", tc.name, tc.text, tc.stops, got, tc.want)
		}
	}
}

func TestSamplerHonoursGreedyTopKAndTopP(t *testing.T) {
	logits := []float32{0.1, 2.0, 1.9, -1, 0.5}
	seed := int64(7)
	cases := []struct {
		name string
		p    SamplingParams
		want map[int32]bool
	}{
		{"temperature 0 is argmax", SamplingParams{Temperature: 0}, map[int32]bool{1: true}},
		{"top_k 2 draws only the two best", SamplingParams{Temperature: 1, TopK: 2, Seed: &seed}, map[int32]bool{1: true, 2: true}},
		{"a tiny top_p keeps only the best", SamplingParams{Temperature: 1, TopP: 0.01, Seed: &seed}, map[int32]bool{1: true}},
	}
	for _, tc := range cases {
		s := newSampler(tc.p, 0)
		seen := map[int32]bool{}
		for range 200 {
			tok := s.sample(logits)
			if !tc.want[tok] {
				t.Fatalf("%s: drew %d", tc.name, tok)
			}
			seen[tok] = true
		}
		if len(seen) != len(tc.want) {
			t.Errorf("%s: drew %v, want all of %v", tc.name, seen, tc.want)
		}
	}
	lp, ids, lps := logSoftmax(logits, 2, 2)
	if ids[0] != 1 || ids[1] != 2 || lps[1] != lp || lps[0] <= lp {
		t.Errorf("logSoftmax top = %v %v, lp(2) = %g", ids, lps, lp)
	}
}

func TestProbsIsTopKTemperatureSoftmaxTopP(t *testing.T) {
	logits := []float32{0.1, 2.0, 1.9, -1, 0.5}
	// softmax by hand over the kept ids, exp(l/T) normalised.
	want := func(T float64, kept ...int) []float64 {
		out := make([]float64, len(logits))
		var sum float64
		for _, i := range kept {
			out[i] = math.Exp(float64(logits[i]) / T)
			sum += out[i]
		}
		for _, i := range kept {
			out[i] /= sum
		}
		return out
	}
	cases := []struct {
		name string
		p    SamplingParams
		want []float64
	}{
		{"plain softmax", SamplingParams{Temperature: 1}, want(1, 0, 1, 2, 3, 4)},
		{"temperature 0.5, top_k 3", SamplingParams{Temperature: 0.5, TopK: 3}, want(0.5, 1, 2, 4)},
		// At T=1 the sorted masses are 0.430, 0.389, 0.096, 0.064, 0.021:
		// top_p 0.85 keeps the first three (0.819 < 0.85 <= 0.914), top_p
		// 0.8 the first two.
		{"top_p 0.85", SamplingParams{Temperature: 1, TopP: 0.85}, want(1, 1, 2, 4)},
		{"top_p 0.8", SamplingParams{Temperature: 1, TopP: 0.8}, want(1, 1, 2)},
	}
	for _, tc := range cases {
		got := newSampler(tc.p, 0).probs(logits, nil)
		for i := range got {
			if math.Abs(got[i]-tc.want[i]) > 1e-12 {
				t.Errorf("%s: probs = %v, want %v", tc.name, got, tc.want)
				break
			}
		}
	}
}

// TestSpeculativeSamplingStepIsDistributedAsTheTarget checks the theorem of
// speculative sampling (Leviathan et al. 2023, Theorem 3.5 and its
// acceptance rate β = Σ min(p, q)): with x drawn from q, acceptOrResample's
// token is distributed as p, for drafts close to, far from and equal to the
// target, and drafts that give zero mass to tokens the target likes.
func TestSpeculativeSamplingStepIsDistributedAsTheTarget(t *testing.T) {
	norm := func(w ...float64) []float64 {
		var s float64
		for _, x := range w {
			s += x
		}
		for i := range w {
			w[i] /= s
		}
		return w
	}
	cases := []struct {
		name string
		p, q []float64
	}{
		{"close", norm(5, 3, 1, 1, 0, 2), norm(4, 3, 2, 1, 0, 2)},
		{"far", norm(8, 1, 1, 0, 0, 0), norm(0, 1, 1, 4, 4, 0)},
		{"equal", norm(1, 2, 3, 4, 5, 6), norm(1, 2, 3, 4, 5, 6)},
		{"draft misses the target's best", norm(0, 0, 6, 1, 1, 2), norm(3, 3, 0, 1, 1, 2)},
		{"one-hot target", norm(0, 0, 0, 1, 0, 0), norm(1, 1, 1, 1, 1, 1)},
	}
	const trials = 200_000
	for _, tc := range cases {
		rng := rand.New(rand.NewPCG(1, 2))
		counts := make([]float64, len(tc.p))
		kept := 0
		var scratch []float64
		for range trials {
			x := drawFrom(tc.q, rng)
			tok, ok, s := acceptOrResample(tc.p, tc.q, x, rng, scratch)
			scratch = s
			counts[tok]++
			if ok {
				kept++
			}
		}
		var beta float64
		for i := range tc.p {
			beta += math.Min(tc.p[i], tc.q[i])
			// 5 standard deviations of a frequency over 200,000 trials is
			// at most 0.0056.
			if f := counts[i] / trials; math.Abs(f-tc.p[i]) > 0.0056 {
				t.Errorf("%s: token %d drawn with frequency %.4f, the target's probability is %.4f", tc.name, i, f, tc.p[i])
			}
		}
		if a := float64(kept) / trials; math.Abs(a-beta) > 0.0056 {
			t.Errorf("%s: acceptance %.4f, Σ min(p, q) = %.4f", tc.name, a, beta)
		}
	}
}
