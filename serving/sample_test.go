package serving

import "testing"

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
