package registry

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func TestConcurrentAdmissionsWithABudgetFittingExactlyThreeAdmitThree(t *testing.T) {
	ctx := context.Background()
	r := open(t, locate(t), &clock{t: t0})
	m := put(t, r, Member{Name: "alice", BudgetUSD: 0.3, Period: PeriodDay})
	const n = 30
	var admitted, refused atomic.Int32
	var wg sync.WaitGroup
	held := make(chan *Reservation, n)
	start := make(chan struct{})
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			res, err := r.Reserve(ctx, m, 100, 0.1)
			var ob *OverBudget
			switch {
			case err == nil:
				admitted.Add(1)
				held <- res
			case errors.As(err, &ob):
				refused.Add(1)
			default:
				t.Error(err)
			}
		}()
	}
	close(start)
	wg.Wait()
	close(held)
	if admitted.Load() != 3 || refused.Load() != n-3 {
		t.Fatalf("admitted %d, refused %d; want 3 and %d", admitted.Load(), refused.Load(), n-3)
	}
	// The three record their usage (0.1 each, settling their reservation) and release: the budget is spent.
	for res := range held {
		if _, err := r.Record(ctx, Usage{Member: "alice", PromptTokens: 50, CompletionTokens: 50, CostUSD: 0.1, Reservation: res.ID}); err != nil {
			t.Fatal(err)
		}
		if err := res.Release(ctx); err != nil {
			t.Fatal(err)
		}
		if err := res.Release(ctx); err != nil { // idempotent
			t.Fatal(err)
		}
	}
	if _, err := r.Reserve(ctx, m, 1, 0.000001); err == nil {
		t.Fatal("a fourth request was admitted on a spent budget")
	}
	left, _, _ := r.Remaining(ctx, m)
	if left != 0 {
		t.Fatalf("remaining %v, want 0", left)
	}
}

func TestAReleasedReservationOfAFailedRequestFreesTheBudget(t *testing.T) {
	ctx := context.Background()
	r := open(t, locate(t), &clock{t: t0})
	m := put(t, r, Member{Name: "bob", BudgetUSD: 0.2})
	first, err := r.Reserve(ctx, m, 10, 0.1)
	if err != nil {
		t.Fatal(err)
	}
	second, err := r.Reserve(ctx, m, 10, 0.1)
	if err != nil {
		t.Fatal(err)
	}
	_, err = r.Reserve(ctx, m, 10, 0.1)
	var ob *OverBudget
	if !errors.As(err, &ob) || ob.SpentUSD != 0 || ob.ReservedUSD != 0.2 || ob.ExpectedUSD != 0.1 {
		t.Fatalf("third reservation: %v", err)
	}
	first.Release(ctx) // the request failed: nothing recorded
	third, err := r.Reserve(ctx, m, 10, 0.1)
	if err != nil {
		t.Fatalf("after a failed request released its reservation: %v", err)
	}
	second.Release(ctx)
	third.Release(ctx)
	if usd, tokens, err := r.Held(ctx, "bob"); err != nil || usd != 0 || tokens != 0 {
		t.Fatalf("held after every release: %v USD, %d tokens, %v", usd, tokens, err)
	}
}

func TestARecordSettlesItsReservationAndReleaseFreesTheRest(t *testing.T) {
	ctx := context.Background()
	r := open(t, locate(t), &clock{t: t0})
	m := put(t, r, Member{Name: "eve", BudgetUSD: 1, TPM: 1000})
	res, err := r.Reserve(ctx, m, 600, 0.6) // worst case: e.g. n=3 × 200 tokens
	if err != nil {
		t.Fatal(err)
	}
	// Two attempts of the request are recorded: each moves its cost and
	// tokens from the hold to the spend, so nothing counts twice.
	for _, u := range []Usage{{PromptTokens: 100, CompletionTokens: 100, CostUSD: 0.2}, {PromptTokens: 50, CompletionTokens: 50, CostUSD: 0.1}} {
		u.Member, u.DecisionID, u.Reservation = "eve", "d-1", res.ID
		if _, err := r.Record(ctx, u); err != nil {
			t.Fatal(err)
		}
	}
	if usd, tokens, _ := r.Held(ctx, "eve"); usd != 0.3 || tokens != 300 {
		t.Fatalf("held %v USD %d tokens after two records, want 0.3 and 300 (0.6 − 0.3, 600 − 300)", usd, tokens)
	}
	// spent 0.3 + held 0.3 + 0.5 > 1: refused; after the release, admitted.
	if _, err := r.Reserve(ctx, m, 10, 0.5); err == nil {
		t.Fatal("admitted over the budget with the rest still held")
	}
	res.Release(ctx)
	if _, err := r.Reserve(ctx, m, 10, 0.5); err != nil {
		t.Fatalf("after the release: %v", err)
	}
}

func TestTPMCountsTheRequestsOwnTokens(t *testing.T) {
	ctx := context.Background()
	c := &clock{t: t0}
	r := open(t, locate(t), c)
	m := put(t, r, Member{Name: "carol", TPM: 250})

	_, err := r.Reserve(ctx, m, 3000, 0)
	var lim *Limited
	if !errors.As(err, &lim) || !lim.TooLarge || lim.Limit != 250 || lim.Requested != 3000 || lim.RetryAfter != 0 {
		t.Fatalf("a 3000-token request under TPM 250: %v", err)
	}
	want := "request too large for the tokens per minute limit (TPM): limit 250, requested 3000; send a shorter prompt or a lower max_tokens"
	if lim.Error() != want {
		t.Fatalf("message %q", lim.Error())
	}

	// 30 concurrent requests of 102 tokens: exactly two fit 250.
	var admitted atomic.Int32
	var wg sync.WaitGroup
	for range 30 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := r.Reserve(ctx, m, 102, 0); err == nil {
				admitted.Add(1)
			}
		}()
	}
	wg.Wait()
	if admitted.Load() != 2 {
		t.Fatalf("admitted %d requests of 102 tokens under TPM 250, want 2", admitted.Load())
	}
	// One that does not fit next to the tokens in flight only: Retry-After 1 s.
	_, err = r.Reserve(ctx, m, 100, 0)
	if !errors.As(err, &lim) || lim.Used != 204 || lim.RetryAfter != time.Second {
		t.Fatalf("100 tokens next to 204 in flight under TPM 250: %v", err)
	}
}

func TestTPMRetryAfterIsWhenRecordedTokensLeaveTheWindow(t *testing.T) {
	ctx := context.Background()
	c := &clock{t: t0}
	r := open(t, locate(t), c)
	m := put(t, r, Member{Name: "dave", TPM: 250})
	res, err := r.Reserve(ctx, m, 200, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.Record(ctx, Usage{Member: "dave", PromptTokens: 100, CompletionTokens: 100, Reservation: res.ID}); err != nil {
		t.Fatal(err)
	}
	res.Release(ctx)
	c.add(20 * time.Second)
	_, err = r.Reserve(ctx, m, 100, 0)
	var lim *Limited
	if !errors.As(err, &lim) || lim.TooLarge || lim.Used != 200 || lim.Requested != 100 || lim.RetryAfter != 40*time.Second {
		t.Fatalf("100 tokens with 200 recorded under TPM 250: %v", err)
	}
	c.add(40 * time.Second)
	if _, err := r.Reserve(ctx, m, 100, 0); err != nil {
		t.Fatalf("after the window moved on: %v", err)
	}
}

func TestTheReservationsOfADeadProcessExpireWithTheirLease(t *testing.T) {
	ctx := context.Background()
	path := locate(t)
	c := &clock{t: t0}
	dead, err := Open(path, Options{Now: c.now, Lease: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	m := put(t, dead, Member{Name: "frank", BudgetUSD: 1})
	if _, err := dead.Reserve(ctx, m, 10, 0.9); err != nil {
		t.Fatal(err)
	}
	// The process dies (kill -9: no release, no renewal). Another sees the hold …
	alive := open(t, path, c)
	if _, err := alive.Reserve(ctx, m, 10, 0.5); err == nil {
		t.Fatal("admitted next to a live 0.9 hold on a budget of 1")
	}
	// … until the lease runs out.
	c.add(time.Minute)
	if _, err := alive.Reserve(ctx, m, 10, 0.5); err != nil {
		t.Fatalf("after the dead process's lease expired: %v", err)
	}
	dead.Close()
}

func TestALiveProcessRenewsItsLeases(t *testing.T) {
	ctx := context.Background()
	path := locate(t)
	// A real clock: the renewal runs on a ticker (Lease/4 = 50 ms).
	r, err := Open(path, Options{Lease: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	m := put(t, r, Member{Name: "gina", BudgetUSD: 1})
	res, err := r.Reserve(ctx, m, 10, 0.9)
	if err != nil {
		t.Fatal(err)
	}
	// Read the expiry until it has moved past the first one: the owner renews.
	var first, later int64
	if err := r.db.QueryRow(`SELECT expires FROM reservations WHERE id = ?`, res.ID).Scan(&first); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(5 * time.Second); later <= first; {
		if time.Now().After(deadline) {
			t.Fatalf("the lease was not renewed: expires %d, still %d", first, later)
		}
		if err := r.db.QueryRow(`SELECT expires FROM reservations WHERE id = ?`, res.ID).Scan(&later); err != nil {
			t.Fatal(err)
		}
		time.Sleep(10 * time.Millisecond) // polling a condition with a deadline
	}
	if _, err := r.Reserve(ctx, m, 10, 0.5); err == nil {
		t.Fatal("a renewed hold was ignored")
	}
}
