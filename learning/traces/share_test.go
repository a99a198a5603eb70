package traces

import (
	"testing"
	"time"

	"github.com/molly-gateway/molly/router/pipeline"
)

// TestShareBucketsRequestsByCategoryAndTier: counts per hour bucket and
// category, shares of the category's requests, old buckets dropped.
func TestShareBucketsRequestsByCategoryAndTier(t *testing.T) {
	s := NewShare(time.Hour, 2)
	clock := time.Date(2026, 12, 1, 9, 10, 0, 0, time.UTC)
	s.now = func() time.Time { return clock }
	served := func(task, tier string) pipeline.Outcome {
		return pipeline.Outcome{Task: task, Answered: 0, Attempts: []pipeline.Attempt{{Tier: tier}}}
	}
	for range 3 {
		s.Record(served("math", "T1"))
	}
	s.Record(served("math", "T0"))
	s.Record(served("chat", "T3"))
	s.Record(pipeline.Outcome{Task: "math", Answered: -1, Attempts: []pipeline.Attempt{{Tier: "T1"}}}) // no answer: not counted
	clock = clock.Add(time.Hour)
	s.Record(served("math", "T0"))
	rows := s.Rows()
	if len(rows) != 3 {
		t.Fatalf("rows %+v", rows)
	}
	first := rows[1] // 09:00 math (chat sorts first)
	if rows[0].Category != "chat" || first.Category != "math" || first.Requests != 4 || first.Tiers["T1"] != 3 || first.Share["T0"] != 0.25 ||
		!first.Start.Equal(time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC)) {
		t.Fatalf("09:00 rows %+v", rows[:2])
	}
	if r := rows[2]; r.Category != "math" || r.Requests != 1 || r.Share["T0"] != 1 || r.Start.Hour() != 10 {
		t.Fatalf("10:00 row %+v", r)
	}
	clock = clock.Add(2 * time.Hour) // keep 2: the 09:00 and 10:00 buckets go
	s.Record(served("math", "T0"))
	if rows := s.Rows(); len(rows) != 1 || rows[0].Start.Hour() != 12 {
		t.Fatalf("after two hours: %+v", rows)
	}
}
