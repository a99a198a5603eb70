package registry

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/molly-gateway/molly/registry/sqlite"
)

// TestConcurrentRecordsAreEachCommittedWithTheirCountersAndOutbox records
// from 16 goroutines at once — reservations settled, two sinks, one
// decision shared by all — and checks the file against sums of what was
// recorded, computed here from the inputs: every record once with a
// distinct id, the shared decision numbered 1..16, the spend counter, the
// holds, one outbox row per record and sink.
func TestConcurrentRecordsAreEachCommittedWithTheirCountersAndOutbox(t *testing.T) {
	ctx := context.Background()
	r := open(t, locate(t), &clock{t: t0})
	m := put(t, r, Member{Name: "alice", BudgetUSD: 1000, Period: PeriodMonth, PeriodStart: t0.Add(-24 * time.Hour), TPM: 10_000_000})
	for _, sink := range []string{"billing", "audit"} {
		if err := r.RegisterSink(ctx, sink); err != nil {
			t.Fatal(err)
		}
	}
	const workers, each = 16, 20
	var mu sync.Mutex
	ids := map[string]bool{}
	var wantNUSD, wantPrompt, wantCompletion int64
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for k := range each {
				res, err := r.Reserve(ctx, m, 1000, 0.01)
				if err != nil {
					t.Error(err)
					return
				}
				decision := fmt.Sprintf("w%d-%d", w, k)
				if k == each/2 {
					decision = "shared"
				}
				u := Usage{Member: "alice", DecisionID: decision, Model: "m", Target: "t", Tier: "T1",
					PromptTokens: 10 + w, CompletionTokens: k, CostUSD: float64(w*each+k+1) * 1e-6, Reservation: res.ID}
				id, err := r.Record(ctx, u)
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				if ids[id] {
					t.Errorf("record id %s returned twice", id)
				}
				ids[id] = true
				wantNUSD += int64(w*each+k+1) * 1000
				wantPrompt += int64(10 + w)
				wantCompletion += int64(k)
				mu.Unlock()
				if err := res.Release(ctx); err != nil {
					t.Error(err)
				}
			}
		})
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	if len(ids) != workers*each {
		t.Fatalf("%d record ids, want %d", len(ids), workers*each)
	}
	for n := 1; n <= workers; n++ {
		id := "shared"
		if n > 1 {
			id += ":" + strconv.Itoa(n)
		}
		if !ids[id] {
			t.Errorf("the shared decision's records lack %s", id)
		}
	}
	list, _, err := r.UsageRecords(ctx, 0, 1000)
	if err != nil || len(list) != workers*each {
		t.Fatalf("ledger: %d records, %v; want %d", len(list), err, workers*each)
	}
	for _, u := range list {
		if !ids[u.RecordID] {
			t.Fatalf("ledger holds %s, which no Record returned", u.RecordID)
		}
	}
	var spent, prompt, completion, records int64
	if err := r.db.QueryRow(`SELECT spent_nusd, prompt_tokens, completion_tokens, records FROM spend WHERE member = 'alice'`).
		Scan(&spent, &prompt, &completion, &records); err != nil {
		t.Fatal(err)
	}
	if spent != wantNUSD || prompt != wantPrompt || completion != wantCompletion || records != workers*each {
		t.Fatalf("spend counter %d nUSD %d+%d tokens %d records, want %d %d+%d %d", spent, prompt, completion, records,
			wantNUSD, wantPrompt, wantCompletion, workers*each)
	}
	for _, sink := range []string{"billing", "audit"} {
		st, err := r.Outbox(ctx, sink)
		if err != nil || st.Pending != workers*each {
			t.Fatalf("outbox of %s: %+v, %v; want %d pending", sink, st, err, workers*each)
		}
	}
	if usd, tokens, err := r.Held(ctx, "alice"); err != nil || usd != 0 || tokens != 0 {
		t.Fatalf("held %v USD %d tokens (%v) after every release, want 0", usd, tokens, err)
	}
}

// holdWriteLock takes the SQLite file's write lock from a connection of its
// own (another process would do the same) until the returned func is
// called: a Record started meanwhile waits in BEGIN IMMEDIATE.
func holdWriteLock(t *testing.T, path string) (release func()) {
	t.Helper()
	db, err := sqlite.Open(path, sqlite.Options{}, migrations()...)
	if err != nil {
		t.Fatal(err)
	}
	tx, err := db.Begin() // IMMEDIATE: holds the write lock
	if err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	release = func() {
		once.Do(func() {
			tx.Rollback()
			db.Close()
		})
	}
	t.Cleanup(release)
	return release
}

func (g *groupCommit) state() (leading bool, queued, commits int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.leading, len(g.queue), g.commits
}

// TestRecordsWaitingForACommitShareTheNext checks the group commit itself:
// while one record's transaction waits for the file's write lock (held by
// another connection), the records that arrive queue; once it commits, all
// of them are committed in one more transaction, and a record whose
// context ends while it waits in the queue returns that error at once and
// is not recorded.
func TestRecordsWaitingForACommitShareTheNext(t *testing.T) {
	ctx := context.Background()
	path := locate(t)
	r := open(t, path, &clock{t: t0})
	release := holdWriteLock(t, path)
	type result struct {
		id  string
		err error
	}
	first := make(chan result, 1)
	go func() {
		id, err := r.Record(ctx, Usage{Member: "a", DecisionID: "first", PromptTokens: 1})
		first <- result{id, err}
	}()
	waitFor(t, 10*time.Second, "the first record leads and waits for the lock", func() bool {
		leading, queued, _ := r.group.state()
		return leading && queued == 0
	})
	const k = 12
	results := make(chan result, k)
	for i := range k {
		go func() {
			id, err := r.Record(ctx, Usage{Member: "a", DecisionID: "next-" + strconv.Itoa(i), PromptTokens: 1})
			results <- result{id, err}
		}()
	}
	waitFor(t, 10*time.Second, "12 records queue", func() bool { _, queued, _ := r.group.state(); return queued == k })

	// One more, withdrawn by its caller while it waits.
	cctx, cancel := context.WithCancel(ctx)
	withdrawn := make(chan error, 1)
	go func() {
		_, err := r.Record(cctx, Usage{Member: "a", DecisionID: "withdrawn", PromptTokens: 1})
		withdrawn <- err
	}()
	waitFor(t, 10*time.Second, "the 13th record queues", func() bool { _, queued, _ := r.group.state(); return queued == k+1 })
	cancel()
	if err := <-withdrawn; !errors.Is(err, context.Canceled) {
		t.Fatalf("withdrawn record: %v, want context.Canceled", err)
	}

	release()
	if res := <-first; res.err != nil || res.id != "first" {
		t.Fatalf("first record: %q, %v", res.id, res.err)
	}
	var got []string
	for range k {
		res := <-results
		if res.err != nil {
			t.Fatal(res.err)
		}
		got = append(got, res.id)
	}
	slices.Sort(got)
	var want []string
	for i := range k {
		want = append(want, "next-"+strconv.Itoa(i))
	}
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Fatalf("queued records got ids %v, want %v", got, want)
	}
	if _, _, commits := r.group.state(); commits != 2 {
		t.Fatalf("%d transactions for 1 + %d records, want 2 (the first, then every queued record together)", commits, k)
	}
	list, _, err := r.UsageRecords(ctx, 0, 100)
	if err != nil || len(list) != k+1 {
		t.Fatalf("ledger: %d records (%v), want %d: the withdrawn one is not recorded", len(list), err, k+1)
	}
	for _, u := range list {
		if u.RecordID == "withdrawn" {
			t.Fatal("the withdrawn record is in the ledger")
		}
	}
}

// TestABadRecordFailsAloneInItsGroup commits a group whose middle record
// cannot be written (its record id is taken: decision "a:2" after decision
// a's second record): that record fails, the others are committed with
// their counters, and nothing of the bad one is left.
func TestABadRecordFailsAloneInItsGroup(t *testing.T) {
	ctx := context.Background()
	r := open(t, locate(t), &clock{t: t0})
	for range 2 {
		if _, err := r.Record(ctx, Usage{Member: "a", DecisionID: "a", PromptTokens: 1, CostUSD: 0.001}); err != nil {
			t.Fatal(err)
		}
	}
	group := []*pending{
		{ctx: ctx, u: Usage{Member: "a", DecisionID: "b", PromptTokens: 2, CostUSD: 0.002}},
		{ctx: ctx, u: Usage{Member: "a", DecisionID: "a:2", PromptTokens: 4, CostUSD: 0.004}},
		{ctx: ctx, u: Usage{Member: "a", DecisionID: "c", PromptTokens: 8, CostUSD: 0.008}},
	}
	r.commitGroup(group)
	if group[0].err != nil || group[0].id != "b" || group[2].err != nil || group[2].id != "c" {
		t.Fatalf("good records: %q %v, %q %v", group[0].id, group[0].err, group[2].id, group[2].err)
	}
	if group[1].err == nil {
		t.Fatalf("the record with a taken id was recorded as %q", group[1].id)
	}
	list, _, err := r.UsageRecords(ctx, 0, 100)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, u := range list {
		got = append(got, u.RecordID)
	}
	if want := []string{"a", "a:2", "b", "c"}; !slices.Equal(got, want) {
		t.Fatalf("ledger %v, want %v", got, want)
	}
	var spent, prompt, records int64
	if err := r.db.QueryRow(`SELECT spent_nusd, prompt_tokens, records FROM spend WHERE member = 'a'`).Scan(&spent, &prompt, &records); err != nil {
		t.Fatal(err)
	}
	if spent != 12_000_000 || prompt != 12 || records != 4 { // 1+1+2+8 mUSD, 1+1+2+8 tokens
		t.Fatalf("spend counter %d nUSD %d tokens %d records, want 12000000, 12, 4", spent, prompt, records)
	}
}
