package registry

import (
	"context"
	"errors"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func TestConcurrentAdmissionsWithABudgetFittingExactlyThreeAdmitThree(t *testing.T) {
	ctx := context.Background()
	r := open(t, filepath.Join(t.TempDir(), "molly.db"), &clock{t: t0})
	m := put(t, r, Member{Name: "alice", BudgetUSD: 0.3, Period: PeriodDay})
	const n = 30
	var admitted, refused atomic.Int32
	var wg sync.WaitGroup
	releases := make(chan func(), n)
	start := make(chan struct{})
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			release, err := r.Reserve(ctx, m, 100, 0.1)
			var ob *OverBudget
			switch {
			case err == nil:
				admitted.Add(1)
				releases <- release
			case errors.As(err, &ob):
				refused.Add(1)
			default:
				t.Error(err)
			}
		}()
	}
	close(start)
	wg.Wait()
	close(releases)
	if admitted.Load() != 3 || refused.Load() != n-3 {
		t.Fatalf("admitted %d, refused %d; want 3 and %d", admitted.Load(), refused.Load(), n-3)
	}
	// The three record their usage (0.1 each) and release: the budget is spent.
	for release := range releases {
		if err := r.Record(ctx, Usage{Member: "alice", PromptTokens: 50, CompletionTokens: 50, CostUSD: 0.1}); err != nil {
			t.Fatal(err)
		}
		release()
		release() // idempotent
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
	r := open(t, filepath.Join(t.TempDir(), "molly.db"), &clock{t: t0})
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
	first() // the request failed: nothing recorded
	third, err := r.Reserve(ctx, m, 10, 0.1)
	if err != nil {
		t.Fatalf("after a failed request released its reservation: %v", err)
	}
	second()
	third()
	if len(r.reserved) != 0 {
		t.Fatalf("reservations left after every release: %+v", r.reserved)
	}
}

func TestTPMCountsTheRequestsOwnTokens(t *testing.T) {
	ctx := context.Background()
	c := &clock{t: t0}
	r := open(t, filepath.Join(t.TempDir(), "molly.db"), c)
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
}

func TestTPMRetryAfterIsWhenRecordedTokensLeaveTheWindow(t *testing.T) {
	ctx := context.Background()
	c := &clock{t: t0}
	r := open(t, filepath.Join(t.TempDir(), "molly.db"), c)
	m := put(t, r, Member{Name: "dave", TPM: 250})
	release, err := r.Reserve(ctx, m, 200, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Record(ctx, Usage{Member: "dave", PromptTokens: 100, CompletionTokens: 100}); err != nil {
		t.Fatal(err)
	}
	release()
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
