package plugins

import (
	"testing"
	"time"
)

func TestBackoffDoublesFromMinToMax(t *testing.T) {
	m := &Manager{opts: Options{MinBackoff: 100 * time.Millisecond, MaxBackoff: time.Second}}
	cases := []struct {
		name     string
		failures int
		want     time.Duration
	}{
		{"the first failure waits the minimum", 1, 100 * time.Millisecond},
		{"the second failure waits twice as long", 2, 200 * time.Millisecond},
		{"the fourth failure waits eight times as long", 4, 800 * time.Millisecond},
		{"the fifth failure is capped at the maximum", 5, time.Second},
		{"the hundredth failure stays at the maximum", 100, time.Second},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := &managed{m: m, failures: c.failures}
			if got := p.backoff(); got != c.want {
				t.Errorf("backoff after %d failures = %v, want %v", c.failures, got, c.want)
			}
		})
	}
}
