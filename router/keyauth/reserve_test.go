package keyauth

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/molly-gateway/molly/registry"
	"github.com/molly-gateway/molly/router/meter"
	"github.com/molly-gateway/molly/router/openai"
)

func TestTheLedgerReservesAndAnswersOpenAIStyle429s(t *testing.T) {
	ctx := context.Background()
	reg, err := registry.Open(filepath.Join(t.TempDir(), "molly.db"), registry.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { reg.Close() })
	m, _, err := reg.PutMember(ctx, registry.Member{Name: "alice", BudgetUSD: 0.3, TPM: 1000})
	if err != nil {
		t.Fatal(err)
	}
	l := &Ledger{Registry: reg, Member: m}

	// A budget that fits exactly three requests admits exactly three of ten concurrent ones.
	var wg sync.WaitGroup
	var mu sync.Mutex
	admitted, quota := 0, 0
	var releases []func()
	for range 10 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			release, err := l.Reserve(ctx, 10, 0.1)
			mu.Lock()
			defer mu.Unlock()
			var e *openai.Error
			switch {
			case err == nil:
				admitted++
				releases = append(releases, release)
			case errors.As(err, &e) && e.Status == 429 && e.Code == "insufficient_quota" && e.Type == "insufficient_quota":
				quota++
			default:
				t.Errorf("reservation: %v", err)
			}
		}()
	}
	wg.Wait()
	if admitted != 3 || quota != 7 {
		t.Fatalf("admitted %d, refused for quota %d; want 3 and 7", admitted, quota)
	}
	// The requests failed: releasing frees the budget for the next.
	for _, release := range releases {
		release()
	}
	release, err := l.Reserve(ctx, 10, 0.1)
	if err != nil {
		t.Fatalf("after the releases: %v", err)
	}
	release()
	// Nothing spent, but the request's worst case is more than the whole
	// budget: the refusal says it does not fit, not that it is spent.
	_, err = l.Reserve(ctx, 10, 0.5)
	if e := (*openai.Error)(nil); !errors.As(err, &e) || e.Code != "insufficient_quota" ||
		!strings.HasPrefix(e.Message, "This request does not fit in what is left of your budget of 0.3 USD") || !strings.Contains(e.Message, "it may cost up to 0.5 USD; 0 are spent") {
		t.Fatalf("a request over the whole budget: %v", err)
	}

	// A request larger than the TPM itself: 429 that says so, no Retry-After.
	_, err = l.Reserve(ctx, 3000, 0)
	var e *openai.Error
	if !errors.As(err, &e) || e.Status != 429 || e.Code != "rate_limit_exceeded" || e.Type != "tokens" || e.RetryAfter != 0 ||
		!strings.Contains(e.Message, "request too large for the tokens per minute limit (TPM): limit 1000, requested 3000") {
		t.Fatalf("a 3000-token request under TPM 1000: %v", err)
	}
	// One that does not fit next to the tokens in flight waits: Retry-After 1 s.
	hold, err := l.Reserve(ctx, 900, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer hold()
	_, err = l.Reserve(ctx, 200, 0)
	if !errors.As(err, &e) || e.Status != 429 || e.Code != "rate_limit_exceeded" || e.RetryAfter != 1 {
		t.Fatalf("200 tokens next to 900 in flight under TPM 1000: %v", err)
	}
}

func TestEachRecordOfARequestSettlesItsReservation(t *testing.T) {
	ctx := context.Background()
	reg, err := registry.Open(filepath.Join(t.TempDir(), "molly.db"), registry.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { reg.Close() })
	m, _, err := reg.PutMember(ctx, registry.Member{Name: "bob", BudgetUSD: 1})
	if err != nil {
		t.Fatal(err)
	}
	l := &Ledger{Registry: reg, Member: m}
	release, err := l.Reserve(ctx, 100, 0.5) // the worst case: e.g. two cascade attempts
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Record(ctx, meter.Usage{Member: "bob", DecisionID: "d", Model: "m", Target: "t", Tier: "T1", PromptTokens: 10, CostUSD: 0.2}); err != nil {
		t.Fatal(err)
	}
	if usd, _, _ := reg.Held(ctx, "bob"); usd != 0.3 {
		t.Fatalf("held %v after a 0.2 record on a 0.5 hold, want 0.3", usd)
	}
	release()
	if usd, _, _ := reg.Held(ctx, "bob"); usd != 0 {
		t.Fatalf("held %v after the release, want 0", usd)
	}
	if left, _, _ := reg.Remaining(ctx, m); left != 0.8 {
		t.Fatalf("remaining %v, want 0.8", left)
	}
}
