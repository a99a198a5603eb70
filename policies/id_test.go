package policies

import (
	"testing"
	"time"

	"github.com/google/uuid"
)

// Decision ids are RFC 9562 version 7 UUIDs, checked with google/uuid's
// parser: the variant and version bits, the time they carry, and that ids
// made later sort later (what the registry's indexes rely on).
func TestDecisionIDsAreTimeOrderedUUIDv7(t *testing.T) {
	before := time.Now().Truncate(time.Millisecond)
	var ids []string
	seen := map[string]bool{}
	for i := range 2000 {
		if i%500 == 0 {
			time.Sleep(2 * time.Millisecond) // the ids must span several milliseconds
		}
		id := newID()
		if seen[id] {
			t.Fatalf("id %s made twice", id)
		}
		seen[id] = true
		ids = append(ids, id)
	}
	after := time.Now()
	for i, id := range ids {
		u, err := uuid.Parse(id)
		if err != nil {
			t.Fatalf("%q: %v", id, err)
		}
		if u.Version() != 7 || u.Variant() != uuid.RFC4122 {
			t.Fatalf("%s: version %d variant %v, want 7 and RFC 4122", id, u.Version(), u.Variant())
		}
		sec, nsec := u.Time().UnixTime()
		at := time.Unix(sec, nsec)
		if at.Before(before) || at.After(after) {
			t.Fatalf("%s carries %v, made between %v and %v", id, at, before, after)
		}
		if i > 0 && id[:13] < ids[i-1][:13] {
			t.Fatalf("%s (made later) sorts before %s", id, ids[i-1])
		}
	}
}
