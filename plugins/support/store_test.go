package main

import (
	"slices"
	"testing"
)

func TestTheLifecycleAllowsOnlyItsTransitions(t *testing.T) {
	all := []string{"open", "pending", "solved", "closed"}
	allowed := map[[2]string]bool{
		{"open", "pending"}: true, {"open", "solved"}: true, {"open", "closed"}: true,
		{"pending", "open"}: true, {"pending", "solved"}: true, {"pending", "closed"}: true,
		{"solved", "open"}: true, {"solved", "closed"}: true,
	}
	for _, from := range all {
		for _, to := range all {
			name := from + " to " + to
			if allowed[[2]string{from, to}] {
				name += " is allowed"
			} else {
				name += " is refused"
			}
			t.Run(name, func(t *testing.T) {
				if got := slices.Contains(transitions[from], to); got != allowed[[2]string{from, to}] {
					t.Errorf("transition %s → %s allowed = %v", from, to, got)
				}
			})
		}
	}
}
