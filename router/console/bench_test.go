package console

import (
	"testing"
	"time"

	"github.com/molly-gateway/molly/router/observe"
	"github.com/molly-gateway/molly/router/pipeline"
)

var sink pipeline.Outcome

// BenchmarkRecord is what the recorders add to each request: the console's
// and the metrics' Record of one fallback outcome with a redaction,
// against the baseline of handing the Outcome value over (what the
// pipeline does for each recorder). Compare their ns/op in one run.
func BenchmarkRecord(b *testing.B) {
	o := answered("ann", "billing", external, 0.1, device)
	o.Findings, o.RedactedTypes, o.Duration = map[string]int{"EMAIL": 1}, []string{"EMAIL"}, time.Millisecond
	o.Plan.Reasons = []string{"1 fallbacks in order"}
	o.Reasons = []string{"sensitivity public allows T0,T1,T2,T3"}
	b.Run("baseline=copy", func(b *testing.B) {
		b.ReportAllocs()
		for range b.N {
			sink = o
		}
	})
	b.Run("console", func(b *testing.B) {
		r := NewRecorder(0, 0, 0)
		b.ReportAllocs()
		for range b.N {
			r.Record(o)
		}
	})
	b.Run("metrics", func(b *testing.B) {
		m := observe.NewMetrics()
		b.ReportAllocs()
		for range b.N {
			m.Record(o)
		}
	})
	b.Run("state", func(b *testing.B) {
		r := NewRecorder(0, 0, 0)
		for range DefaultDecisions {
			r.Record(o)
		}
		b.ReportAllocs()
		for range b.N {
			_ = r.State(Sources{}, StateDecisions)
		}
	})
}
