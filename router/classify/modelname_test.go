package classify

import (
	"strconv"
	"testing"
)

// TestCheckModelNameRemembersOnlyCleanNames checks the remembered names of
// checkModelName: a name with an e-mail address in it (personal data by
// construction) is refused every time, before and after the memory is
// full; clean names are accepted every time; at most maxCleanNames are
// remembered.
func TestCheckModelNameRemembersOnlyCleanNames(t *testing.T) {
	c := testClassifier(t)
	const dirty = "ft:alice.rossi@example.com:chat"
	for round := range 2 {
		if err := c.checkModelName(dirty); err == nil || err.Param != "model" {
			t.Fatalf("round %d: %q accepted (%v); want a 400 about model", round, dirty, err)
		}
		for i := range maxCleanNames + 50 {
			name := "model-" + strconv.Itoa(i)
			if err := c.checkModelName(name); err != nil {
				t.Fatalf("round %d: %q refused: %v", round, name, err)
			}
		}
	}
	if err := c.checkModelName(dirty); err == nil {
		t.Fatalf("%q accepted once the memory is full", dirty)
	}
	n := 0
	c.cleanNames.Range(func(k, _ any) bool {
		n++
		if k == dirty {
			t.Errorf("%q remembered as clean", dirty)
		}
		return true
	})
	if n == 0 || n > maxCleanNames {
		t.Errorf("%d names remembered; want 1..%d", n, maxCleanNames)
	}
}
