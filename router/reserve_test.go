package router

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/molly-gateway/molly/api"
)

// reservingLedger is a memLedger that is also a Reserver: it notes what
// was reserved and released, and refuses with refuse when set.
type reservingLedger struct {
	memLedger
	mu       sync.Mutex
	refuse   *api.Error
	tokens   []int
	usd      []float64
	released int
	recorded int // usages recorded when the last release came
}

func (l *reservingLedger) Reserve(_ context.Context, tokens int, expectedUSD float64) (func(), error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.refuse != nil {
		return nil, l.refuse
	}
	l.tokens, l.usd = append(l.tokens, tokens), append(l.usd, expectedUSD)
	return func() {
		l.mu.Lock()
		defer l.mu.Unlock()
		l.released++
		l.memLedger.mu.Lock()
		l.recorded = len(l.memLedger.got)
		l.memLedger.mu.Unlock()
	}, nil
}

func TestTheForwarderReservesTheExpectedTokensAndCostAndReleasesAfterRecording(t *testing.T) {
	quiet := silent(t)
	cat := newCatalogue(t, &Target{Name: "quiet", Tier: "T2", Endpoint: quiet.URL + "/v1", Models: []string{"q"}, PriceIn: 1000, PriceOut: 1000})
	ledger := &reservingLedger{}
	gw := identityGateway(t, cat, &Identity{Member: "alice", Ledger: ledger})
	body := `{"model":"q","messages":[{"role":"user","content":"hi there"}]}` // 8 prompt tokens
	r := post(t, gw.URL+"/v1/chat/completions", body, "X-Molly-Sensitivity", "internal")
	if r.status != 200 {
		t.Fatalf("status %d: %s", r.status, r.body)
	}
	ledger.mu.Lock()
	// 8 prompt + DefaultCompletionTokens (256) = 264 tokens at 1000 USD/1M each.
	if fmt.Sprint(ledger.tokens) != "[264]" || fmt.Sprintf("%.6f", ledger.usd[0]) != "0.264000" || ledger.released != 1 || ledger.recorded != 1 {
		t.Fatalf("reserved %v tokens, %v USD; released %d with %d recorded", ledger.tokens, ledger.usd, ledger.released, ledger.recorded)
	}
	ledger.refuse = &api.Error{Status: http.StatusTooManyRequests, Type: "insufficient_quota", Code: "insufficient_quota", Message: "over budget"}
	ledger.mu.Unlock()
	before := len(ledger.take())
	r = post(t, gw.URL+"/v1/chat/completions", body, "X-Molly-Sensitivity", "internal")
	if r.status != 429 || !strings.Contains(r.body, `"code":"insufficient_quota"`) || len(ledger.take()) != 0 || before != 1 {
		t.Fatalf("refused reservation: status %d %s", r.status, r.body)
	}
}

func TestAClientThatGoesAwayIsBilledThePromptEstimate(t *testing.T) {
	got := make(chan struct{}, 1)
	slow := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body) // then the server notices the connection closing
		got <- struct{}{}
		select {
		case <-r.Context().Done():
		case <-time.After(5 * time.Second):
		}
	}))
	t.Cleanup(slow.Close)
	cat := newCatalogue(t, &Target{Name: "slow", Tier: "T2", Endpoint: slow.URL + "/v1", Models: []string{"q"}, PriceIn: 1000, PriceOut: 1000})
	ledger := &reservingLedger{}
	gw := identityGateway(t, cat, &Identity{Member: "alice", Ledger: ledger})

	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, gw.URL+"/v1/chat/completions",
		strings.NewReader(`{"model":"q","messages":[{"role":"user","content":"hi there"}]}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Molly-Sensitivity", "internal")
	done := make(chan error, 1)
	go func() {
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		done <- err
	}()
	<-got // the upstream has the prompt
	cancel()
	if err := <-done; err == nil {
		t.Fatal("the request finished instead of being cancelled")
	}
	var us []Usage
	for deadline := time.Now().Add(5 * time.Second); len(us) == 0 && time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		us = ledger.take()
	}
	if len(us) != 1 {
		t.Fatalf("recorded %d usages, want 1", len(us))
	}
	u := us[0]
	// "hi there" is 8 prompt tokens at 1000 USD per 1M: 0.008 USD.
	if u.Member != "alice" || u.Target != "slow" || u.Tier != "T2" || u.PromptTokens != 8 || u.CompletionTokens != 0 ||
		!u.Estimated || fmt.Sprintf("%.9f", u.CostUSD) != "0.008000000" || u.DecisionID == "" {
		t.Fatalf("recorded %+v", u)
	}
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		ledger.mu.Lock()
		n := ledger.released
		ledger.mu.Unlock()
		if n == 1 {
			return
		}
	}
	t.Fatal("the reservation was not released")
}
