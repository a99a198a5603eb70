package registry

import (
	"context"
	"fmt"
	"time"
)

// OverBudget says why Reserve refused a request on the member's budget:
// what is spent and held by requests in flight leaves less than the
// request's expected cost.
type OverBudget struct {
	BudgetUSD, SpentUSD, ReservedUSD, ExpectedUSD float64
	// End is when the period renews (zero: the budget covers all time).
	End time.Time
}

func (e *OverBudget) Error() string {
	return fmt.Sprintf("budget %g USD: spent %.6f, held by requests in flight %.6f, this request is expected to cost %.6f",
		e.BudgetUSD, e.SpentUSD, e.ReservedUSD, e.ExpectedUSD)
}

// reserved is what one member's requests in flight hold: expected cost in
// nano-USD and expected tokens.
type reserved struct {
	nusd   int64
	tokens int
}

// Reserve admits one request of m expected to use tokens tokens (prompt
// estimate + max_tokens or a default) and to cost expectedUSD, and holds
// both until release is called (once the usage is recorded, or the request
// failed; release is idempotent). It refuses with *OverBudget when spent +
// reserved + expectedUSD > the budget, and with *Limited (Kind "tokens")
// when the TPM window (recorded + reserved tokens) cannot fit tokens; a
// request larger than the TPM itself is refused with RetryAfter 0 (Limited.TooLarge).
//
// Reservations live in memory, so they bound the requests of one process
// (a registry file shared by several gateways is not coordinated), and
// they are forgotten on restart, where no request is in flight. A request
// whose usage has been recorded but not yet released counts twice for a
// moment: admission errs on the side of refusing.
func (r *Registry) Reserve(ctx context.Context, m Member, tokens int, expectedUSD float64) (release func(), err error) {
	if tokens < 0 {
		tokens = 0
	}
	if expectedUSD < 0 {
		expectedUSD = 0
	}
	if m.TPM > 0 && tokens > m.TPM {
		return nil, &Limited{Kind: "tokens", Limit: m.TPM, Requested: tokens, TooLarge: true}
	}
	exp := nusd(expectedUSD)
	// The spend is read under the lock, so that no reservation is released
	// (its usage committed) between reading the spend and counting it.
	r.resMu.Lock()
	defer r.resMu.Unlock()
	res := r.reserved[m.Name]
	if m.BudgetUSD > 0 {
		left, _, err := r.Remaining(ctx, m)
		if err != nil {
			return nil, err
		}
		budget := nusd(m.BudgetUSD)
		spent := budget - nusd(left)
		if spent+res.nusd+exp > budget {
			_, end := m.PeriodAt(r.now())
			return nil, &OverBudget{BudgetUSD: m.BudgetUSD, SpentUSD: usd(spent), ReservedUSD: usd(res.nusd), ExpectedUSD: expectedUSD, End: end}
		}
	}
	if m.TPM > 0 {
		if lim := r.fitTokens(m, res.tokens, tokens); lim != nil {
			return nil, lim
		}
	}
	res.nusd += exp
	res.tokens += tokens
	r.reserved[m.Name] = res
	done := false
	return func() {
		r.resMu.Lock()
		defer r.resMu.Unlock()
		if done {
			return
		}
		done = true
		res := r.reserved[m.Name]
		res.nusd -= exp
		res.tokens -= tokens
		if res.nusd <= 0 && res.tokens <= 0 {
			delete(r.reserved, m.Name)
			return
		}
		r.reserved[m.Name] = res
	}, nil
}

// fitTokens checks that tokens more fit m's TPM window next to the recorded
// tokens and held ones (inFlight); otherwise it says when enough recorded
// tokens leave the window (1 s when only requests in flight hold it).
func (r *Registry) fitTokens(m Member, inFlight, tokens int) *Limited {
	now := r.now()
	r.mu.Lock()
	defer r.mu.Unlock()
	w := r.win(m.Name)
	w.prune(now)
	used := inFlight
	for _, t := range w.tokens {
		used += t.n
	}
	if used+tokens <= m.TPM {
		return nil
	}
	retry := time.Second
	left := used
	for _, t := range w.tokens {
		left -= t.n
		if left+tokens <= m.TPM {
			retry = max(t.at.Add(RateWindow).Sub(now), time.Millisecond)
			break
		}
	}
	return &Limited{Kind: "tokens", Limit: m.TPM, Used: used, Requested: tokens, RetryAfter: retry}
}
