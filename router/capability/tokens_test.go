package capability

import "testing"

func TestEstimateTokens(t *testing.T) {
	// ceil(runes/4): "ciò è così" is 10 runes.
	for in, want := range map[string]int{"": 0, "a": 1, "abcd": 1, "abcde": 2, "ciò è così": 3} {
		if got := EstimateTokens(in); got != want {
			t.Errorf("EstimateTokens(%q) = %d, want %d", in, got, want)
		}
	}
}
