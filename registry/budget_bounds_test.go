package registry

import (
	"errors"
	"testing"
)

func TestBudgetsMustFitTheNanoDollarLedger(t *testing.T) {
	for _, tc := range []struct {
		name   string
		budget float64
		ok     bool
	}{
		{"no budget is allowed", 0, true},
		{"a cent is allowed", 0.01, true},
		{"a billion dollars is the most", 1e9, true},
		{"ten billion would overflow the int64 of nano-dollars", 1e10, false},
		{"a budget that rounds to zero nano-dollars would mean no budget", 1e-10, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := &Member{Name: "m", BudgetUSD: tc.budget, Period: PeriodDay}
			err := m.Validate()
			if (err == nil) != tc.ok || (err != nil && !errors.Is(err, ErrInvalid)) {
				t.Fatalf("Validate(%g) = %v, want ok=%v", tc.budget, err, tc.ok)
			}
		})
	}
}
