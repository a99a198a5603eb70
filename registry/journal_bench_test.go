package registry

import (
	"context"
	"fmt"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// BenchmarkJournal measures the CPU time the usage journal costs per
// record as the gateway pays it: 16 recorders journal records of a member
// without a budget (as "anonymous", no reservation, a fresh decision id
// per record) and the journal's committer writes them into the ledger.
// A round is 100 records per recorder, then CommitJournal (so the round's
// commits fall into it); its cost is the process's CPU time over the round
// (getrusage(2) RUSAGE_SELF, user + system: the recorders, the committer,
// SQLite, the runtime), divided by the records. "paced" spaces each
// recorder's records gap apart (16 recorders at 5 ms: about 3,000 records
// a second, the gateway's rate on 2 cores, so the committer's groups are
// about as large as there); "burst" journals as fast as it can (groups of
// maxGroup, appends that meet). sinks=1 registers one outbox sink (a
// gateway with a usage_tool). Reported: the median of the rounds' CPU µs
// per record, and wall µs per record. Compare two builds by running their
// test binaries alternately (docs/benchmarks.md).
func BenchmarkJournal(b *testing.B) {
	for _, sinks := range []int{0, 1} {
		for _, pace := range []struct {
			name string
			gap  time.Duration
		}{{"burst", 0}, {"paced", 5 * time.Millisecond}} {
			b.Run(fmt.Sprintf("c=16/%s/sinks=%d", pace.name, sinks), func(b *testing.B) { benchJournal(b, 16, pace.gap, sinks) })
		}
	}
}

func benchJournal(b *testing.B, c int, gap time.Duration, sinks int) {
	ctx := context.Background()
	r := openBenchLedger(b, sinks)
	const perRound = 100 // records per recorder and round
	var n atomic.Int64
	round := func() (cpu, wall float64) {
		cpu0 := cpuTime()
		start := time.Now()
		var wg sync.WaitGroup
		for range c {
			wg.Go(func() {
				for k := range perRound {
					if gap > 0 && k > 0 {
						time.Sleep(gap)
					}
					i := n.Add(1)
					u := Usage{Member: "anonymous", DecisionID: "d-" + strconv.FormatInt(i, 10), Model: "m", Target: "t", Tier: "T1",
						PromptTokens: 100, CompletionTokens: 50, CostUSD: 0.0003, Time: time.Now()}
					if err := r.Journal(ctx, u); err != nil {
						b.Error(err)
					}
				}
			})
		}
		wg.Wait()
		if err := r.CommitJournal(ctx); err != nil {
			b.Fatal(err)
		}
		records := float64(c * perRound)
		return float64((cpuTime() - cpu0).Microseconds()) / records, float64(time.Since(start).Microseconds()) / records
	}
	round() // opens the journal, warms the caches
	rounds := max(3, b.N/(c*perRound))
	var cpu, wall []float64
	b.ResetTimer()
	for range rounds {
		c, w := round()
		cpu, wall = append(cpu, c), append(wall, w)
	}
	b.StopTimer()
	b.ReportMetric(median(cpu), "cpu_us/record")
	b.ReportMetric(median(wall), "wall_us/record")
	b.ReportMetric(0, "ns/op")
}

// cpuTime is the process's CPU time so far (user + system, all threads).
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		panic(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkApplyEntries measures the journal committer's transaction
// alone: groups of 60 records (the gateway's group at ~3,000 records a
// second and the 20 ms commit delay), one per iteration of 60 records.
// repeat=1: the 32nd record of each group is a decision's second record,
// its first in the group before (a decision whose records straddle two
// commits; the worst place for it in a group of 60, the end of its
// largest chunk). Reported: CPU µs per record (getrusage, user + system).
func BenchmarkApplyEntries(b *testing.B) {
	for _, c := range []struct{ sinks, repeat int }{{0, 0}, {1, 0}, {0, 1}} {
		sinks := c.sinks
		b.Run(fmt.Sprintf("group=60/sinks=%d/repeat=%d", sinks, c.repeat), func(b *testing.B) {
			ctx := context.Background()
			r := openBenchLedger(b, sinks)
			const group = 60
			batch := make([]entry, group)
			var n int
			groups := max(1, b.N/group)
			b.ResetTimer()
			cpu0 := cpuTime()
			for g := range groups {
				for k := range batch {
					n++
					batch[k] = entry{kind: entryRecord, seg: 0, end: int64(n * 80), u: Usage{Member: "anonymous", DecisionID: "d-" + strconv.Itoa(n),
						Model: "m", Target: "t", Tier: "T1", PromptTokens: 100, CompletionTokens: 50, CostUSD: 0.0003, Time: time.Now()}}
				}
				if c.repeat > 0 && g > 0 {
					batch[31].u.DecisionID = "d-" + strconv.Itoa(n-group)
				}
				if err := r.applyEntries(ctx, "bench-"+strconv.Itoa(g%1), batch, false); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			b.ReportMetric(float64((cpuTime()-cpu0).Microseconds())/float64(groups*group), "cpu_us/record")
			b.ReportMetric(0, "ns/op")
		})
	}
}

// openBenchLedger opens a registry of its own for b, closed at its end,
// with sinks outbox sinks registered.
func openBenchLedger(b *testing.B, sinks int) *Registry {
	b.Helper()
	r, err := Open(filepath.Join(b.TempDir(), "molly.db"), Options{})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { r.Close() })
	for i := range sinks {
		if err := r.RegisterSink(context.Background(), fmt.Sprintf("sink-%d", i)); err != nil {
			b.Fatal(err)
		}
	}
	return r
}

// BenchmarkJournalAppend measures what Journal costs the request that
// calls it — the append of a record's frame, before any commit — with
// segments mapped (a copy into the mapping, and gone's fstat(2) at most
// every journalGoneEvery: mmap) against one write(2) and one fstat(2) per
// frame (write: the journal before mapping, but for its queue's reuse),
// on a file each, in the same run: rounds of 200 records per recorder alternate between the two
// (ABBA), each journal's committer committing in the background as in
// the gateway, and both journals committed between rounds (outside the
// clock; the queue stays as short as the gateway's). c recorders journal at once (1: the latency a request
// pays; 16: the appends meet at the journal's lock). b.N is the number of
// records per implementation. Reported: the median over rounds of wall
// ns per Journal call for each (at c=16, the round's wall time over its
// records: the lock's throughput), and heap allocations per call.
func BenchmarkJournalAppend(b *testing.B) {
	for _, c := range []int{1, 16} {
		b.Run(fmt.Sprintf("c=%d", c), func(b *testing.B) { benchJournalAppend(b, c) })
	}
}

func benchJournalAppend(b *testing.B, c int) {
	ctx := context.Background()
	var regs [2]*Registry // write, mmap
	saved, savedGone := journalMapped, journalGoneEvery
	defer func() { journalMapped, journalGoneEvery = saved, savedGone }()
	for i := range regs {
		regs[i] = openBenchLedger(b, 0)
		journalMapped = i == 1
		if j := regs[i].openJournal(); j == nil || (j.m != nil) != journalMapped {
			b.Fatalf("journal %d: not opened as mapped=%v", i, journalMapped)
		}
	}
	journalMapped = saved
	const perRound = 200
	var n atomic.Int64
	usage := func() Usage {
		i := n.Add(1)
		return Usage{Member: "anonymous", DecisionID: "d-" + strconv.FormatInt(i, 10), Model: "m", Target: "t", Tier: "T1",
			PromptTokens: 100, CompletionTokens: 50, CostUSD: 0.0003, Time: time.Now()}
	}
	round := func(r *Registry) float64 {
		us := make([][]Usage, c)
		for g := range us {
			for range perRound {
				us[g] = append(us[g], usage()) // made before the clock starts
			}
		}
		start := time.Now()
		var wg sync.WaitGroup
		for g := range c {
			wg.Go(func() {
				for _, u := range us[g] {
					if err := r.Journal(ctx, u); err != nil {
						b.Error(err)
					}
				}
			})
		}
		wg.Wait()
		return float64(time.Since(start).Nanoseconds()) / float64(c*perRound)
	}
	rounds := max(2, b.N/(c*perRound))
	var per [2][]float64
	b.ResetTimer()
	for k := range rounds {
		for _, i := range abbaOrder(k) {
			if i == 0 {
				journalGoneEvery = 0 // the journal before: an fstat(2) per append
			}
			per[i] = append(per[i], round(regs[i]))
			journalGoneEvery = savedGone
		}
		{ // commit, outside the clock: the queue as short as the gateway's
			b.StopTimer()
			for _, r := range regs {
				if err := r.CommitJournal(ctx); err != nil {
					b.Fatal(err)
				}
			}
			b.StartTimer()
		}
	}
	b.StopTimer()
	b.ReportMetric(median(per[0]), "write_ns/record")
	b.ReportMetric(median(per[1]), "mmap_ns/record")
	for i, name := range []string{"write", "mmap"} {
		u := usage()
		b.ReportMetric(testing.AllocsPerRun(100, func() { _ = regs[i].Journal(ctx, u) }), name+"_allocs/record")
	}
	b.ReportMetric(0, "ns/op")
}
