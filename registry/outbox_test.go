package registry

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"sort"
	"sync"
	"testing"
	"time"
)

// waitFor polls cond until it holds or within passes (a condition with a
// deadline, not a sleep).
func waitFor(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, within)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// book is a sink for the tests: it keeps what it acknowledged, by record
// id, and can fail the first attempts of each record.
type book struct {
	mu       sync.Mutex
	booked   map[string]Usage
	calls    map[string]int
	failures int                    // transient failures per record before it is accepted
	refuse   map[string]bool        // records refused for good
	block    chan struct{}          // when set, a send waits for it (or its context)
	at       map[string][]time.Time // when each record was sent
}

func newBook() *book {
	return &book{booked: map[string]Usage{}, calls: map[string]int{}, refuse: map[string]bool{}, at: map[string][]time.Time{}}
}

func (b *book) send(ctx context.Context, u Usage) error {
	if b.block != nil {
		select {
		case <-b.block:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.calls[u.RecordID]++
	b.at[u.RecordID] = append(b.at[u.RecordID], time.Now())
	if b.refuse[u.RecordID] {
		return Permanent(errors.New("conflict: booked with other values"))
	}
	if b.calls[u.RecordID] <= b.failures {
		return errors.New("unavailable: the plugin is restarting")
	}
	b.booked[u.RecordID] = u
	return nil
}

func (b *book) ids() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []string
	for id := range b.booked {
		out = append(out, id)
	}
	sort.Strings(out)
	return out
}

func record(t *testing.T, r *Registry, n int, prefix string) []string {
	t.Helper()
	var ids []string
	for i := range n {
		id, err := r.Record(context.Background(), Usage{Member: "alice", DecisionID: fmt.Sprintf("%s%02d", prefix, i), Model: "m", Target: "t", Tier: "T1",
			PromptTokens: i, CompletionTokens: 1, CostUSD: float64(i) * 1e-6})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	sort.Strings(ids)
	return ids
}

// openReal opens a registry on the real clock: deliverers wait on real timers.
func openReal(t *testing.T, path string) *Registry {
	t.Helper()
	r, err := Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	return r
}

var fast = DeliveryOptions{Timeout: time.Second, MinBackoff: 10 * time.Millisecond, MaxBackoff: 40 * time.Millisecond, Poll: 20 * time.Millisecond}

func TestEveryRecordIsDeliveredOnceWithItsValues(t *testing.T) {
	ctx := context.Background()
	r := openReal(t, locate(t))
	// Records before the sink exists are not queued for it.
	record(t, r, 2, "before-")
	if err := r.RegisterSink(ctx, "billing"); err != nil {
		t.Fatal(err)
	}
	b := newBook()
	d, err := r.Deliver(ctx, "billing", b.send, fast)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	want := record(t, r, 20, "d")
	waitFor(t, 5*time.Second, "20 deliveries", func() bool { return len(b.ids()) == 20 })
	if got := b.ids(); !reflect.DeepEqual(got, want) {
		t.Fatalf("booked %v, want %v", got, want)
	}
	// The values are the ledger's.
	list, _, _ := r.UsageRecords(ctx, 0, 100)
	for _, u := range list[2:] {
		if got := b.booked[u.RecordID]; !reflect.DeepEqual(got, u) {
			t.Fatalf("booked %+v, ledger %+v", got, u)
		}
	}
	waitFor(t, 5*time.Second, "acknowledgements stored", func() bool {
		s, err := r.Outbox(ctx, "billing")
		return err == nil && s.Delivered == 20 && s.Pending == 0
	})
	for id, n := range b.calls {
		if n != 1 {
			t.Fatalf("%s sent %d times", id, n)
		}
	}
	if s := d.Stats(); s.Delivered != 20 || s.Retried != 0 || s.Failed != 0 {
		t.Fatalf("stats %+v", s)
	}
}

func TestAFailingSinkIsRetriedWithGrowingBackoff(t *testing.T) {
	ctx := context.Background()
	r := openReal(t, locate(t))
	b := newBook()
	b.failures = 3
	var mu sync.Mutex
	var attempts []Attempt
	opts := fast
	opts.Observe = func(a Attempt) { mu.Lock(); attempts = append(attempts, a); mu.Unlock() }
	opts.Workers = 1
	d, err := r.Deliver(ctx, "billing", b.send, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	record(t, r, 1, "x")
	waitFor(t, 5*time.Second, "delivery after three failures", func() bool { return len(b.ids()) == 1 })
	// The attempt is observed once its outcome is stored, after the sink acknowledged.
	waitFor(t, 5*time.Second, "the delivery observed", func() bool { mu.Lock(); defer mu.Unlock(); return len(attempts) == 4 })
	times := b.at["x00"]
	if len(times) != 4 {
		t.Fatalf("%d sends, want 4", len(times))
	}
	// Waits: at least half of 10, 20, 40 ms (equal jitter), less the
	// millisecond that next_at's resolution (Unix milliseconds) may take
	// off when the failure's time is truncated.
	for i, least := range []time.Duration{5 * time.Millisecond, 10 * time.Millisecond, 20 * time.Millisecond} {
		if gap := times[i+1].Sub(times[i]); gap < least-time.Millisecond {
			t.Errorf("retry %d after %v, want at least %v", i+1, gap, least)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	var outcomes []string
	for _, a := range attempts {
		outcomes = append(outcomes, fmt.Sprintf("%d:%s", a.N, a.Outcome))
	}
	if want := []string{"1:retry", "2:retry", "3:retry", "4:delivered"}; !reflect.DeepEqual(outcomes, want) {
		t.Fatalf("attempts %v, want %v", outcomes, want)
	}
}

func TestARecordRefusedForGoodIsMarkedFailedAndCanBeRequeued(t *testing.T) {
	ctx := context.Background()
	r := openReal(t, locate(t))
	b := newBook()
	b.refuse["r01"] = true
	d, err := r.Deliver(ctx, "billing", b.send, fast)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	record(t, r, 3, "r")
	waitFor(t, 5*time.Second, "two delivered, one failed", func() bool {
		s, _ := r.Outbox(ctx, "billing")
		return s.Delivered == 2 && s.Failed == 1
	})
	ids, reasons, err := r.FailedRecords(ctx, "billing", 10)
	if err != nil || !reflect.DeepEqual(ids, []string{"r01"}) || reasons[0] != "conflict: booked with other values" {
		t.Fatalf("failed %v %v %v", ids, reasons, err)
	}
	b.mu.Lock()
	calls := b.calls["r01"]
	b.refuse["r01"] = false
	b.mu.Unlock()
	if calls != 1 {
		t.Fatalf("a permanent refusal was sent %d times", calls)
	}
	if n, err := r.Requeue(ctx, "billing"); n != 1 || err != nil {
		t.Fatalf("requeue %d %v", n, err)
	}
	waitFor(t, 5*time.Second, "the requeued record delivered", func() bool { return len(b.ids()) == 3 })
}

// TestPendingRecordsAreSentAfterARestart: records committed while no
// deliverer runs, and one whose deliverer died mid-send (its process gone:
// no acknowledgement, no Close), are sent by the next process.
func TestPendingRecordsAreSentAfterARestart(t *testing.T) {
	ctx := context.Background()
	path := locate(t)
	first, err := Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	// The first process's sink hangs: its claimed records are in flight when it "dies".
	hung := newBook()
	hung.block = make(chan struct{})
	opts := fast
	opts.Timeout, opts.Claim = time.Hour, 300*time.Millisecond
	dead, err := first.Deliver(ctx, "billing", hung.send, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { // only now, after the test: let the abandoned process's goroutines end
		close(hung.block)
		dead.Close()
		first.Close()
	})
	want := record(t, first, 6, "k")
	waitFor(t, 5*time.Second, "the first deliverer claims records", func() bool {
		var n int
		_ = first.db.QueryRow(`SELECT COUNT(*) FROM outbox WHERE claim_until > 0`).Scan(&n)
		return n > 0
	})
	// The restart: a new handle and deliverer; the first is abandoned as after kill -9.
	second := openReal(t, path)
	// Records committed while no deliverer runs wait in the outbox too.
	want = append(want, record(t, second, 3, "while-down-")...)
	sort.Strings(want)
	b := newBook()
	d, err := second.Deliver(ctx, "billing", b.send, fast)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	waitFor(t, 5*time.Second, "every record delivered by the second process", func() bool { return len(b.ids()) == 9 })
	if got := b.ids(); !reflect.DeepEqual(got, want) {
		t.Fatalf("booked %v, want %v", got, want)
	}
}

func TestDeliverRefusesBadOptions(t *testing.T) {
	r := open(t, locate(t), &clock{t: t0})
	for _, tc := range []struct {
		name string
		sink string
		send Sink
		opts DeliveryOptions
	}{
		{"no sink function", "billing", nil, DeliveryOptions{}},
		{"an empty sink name", "", newBook().send, DeliveryOptions{}},
		{"a negative timeout", "billing", newBook().send, DeliveryOptions{Timeout: -1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := r.Deliver(context.Background(), tc.sink, tc.send, tc.opts); !errors.Is(err, ErrInvalid) {
				t.Fatalf("err %v, want ErrInvalid", err)
			}
		})
	}
}
