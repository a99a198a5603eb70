package registry

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync/atomic"
	"time"
)

// OverBudget says why Reserve refused a request on the member's budget:
// what is spent and held by requests in flight leaves less than the
// request's worst-case cost.
type OverBudget struct {
	BudgetUSD, SpentUSD, ReservedUSD, ExpectedUSD float64
	// End is when the period renews (zero: the budget covers all time).
	End time.Time
}

func (e *OverBudget) Error() string {
	return fmt.Sprintf("budget %g USD: spent %.6f, held by requests in flight %.6f, this request may cost up to %.6f",
		e.BudgetUSD, e.SpentUSD, e.ReservedUSD, e.ExpectedUSD)
}

// Reservation is what one request in flight holds of its member's budget
// and TPM, in the registry file (table reservations), so that every process
// sharing the file sees it. Usage records that name its ID settle it
// (Usage.Reservation); Release frees what is left. A reservation of a
// process that dies expires with its lease (Options.Lease).
type Reservation struct {
	// ID names the reservation in Usage.Reservation; 0 for a member
	// without budget and TPM, for whom nothing needs holding.
	ID     int64
	Member string
	// Tokens and USD are what was held at admission.
	Tokens int
	USD    float64

	r        *Registry
	released atomic.Bool
}

// Reserve admits one request of m whose worst case is tokens tokens and
// usd USD — the caller computes it: prompt estimate + n × max_tokens,
// times the attempts a cascade, a mixture or tool rounds may make — and
// holds both until the request's usage records settle them and Release
// frees the rest. The check and the hold are one conditional insert inside
// one IMMEDIATE transaction, so concurrent requests, in this process or in
// another on the same file, cannot together overshoot:
//
//   - budget: spent in the period + held by live reservations + usd ≤ budget,
//     else *OverBudget;
//   - TPM: tokens recorded in the trailing minute + held + tokens ≤ TPM,
//     else *Limited (Kind "tokens"; RetryAfter when enough recorded tokens
//     leave the minute, 1 s when only requests in flight hold it); a
//     request larger than the TPM itself is refused with TooLarge.
//
// Expired reservations (of a process that died) are deleted first.
// Negative amounts count as 0. Other errors are database errors.
func (r *Registry) Reserve(ctx context.Context, m Member, tokens int, usd float64) (*Reservation, error) {
	tokens = max(tokens, 0)
	usd = max(usd, 0)
	if m.TPM > 0 && tokens > m.TPM {
		return nil, &Limited{Kind: "tokens", Limit: m.TPM, Requested: tokens, TooLarge: true}
	}
	res := &Reservation{Member: m.Name, Tokens: tokens, USD: usd, r: r}
	if m.BudgetUSD <= 0 && m.TPM <= 0 {
		return res, nil // nothing to hold
	}
	if err := r.syncJournal(ctx); err != nil { // this handle's records and releases count first
		return nil, fmt.Errorf("registry: reserving for %s: %w", m.Name, err)
	}
	exp, budget := nusd(usd), nusd(m.BudgetUSD)
	var refusal error
	err := r.txq(ctx, func(tx q) error {
		if err := tx.lock(memberLock(m.Name)); err != nil {
			return err
		}
		now := r.now() // under the write lock: admissions and records see one order of time
		nowMS := ms(now)
		if _, err := tx.exec(qExpire, nowMS); err != nil {
			return err
		}
		// One statement: the row is inserted only when both limits hold.
		// On PostgreSQL a Release (which takes no lock: it only frees room)
		// may commit between the insert and the explanation; the room it
		// made is then tried again.
		for range 3 {
			err := tx.row(qReserve,
				m.Name, exp, tokens, r.owner, nowMS, ms(now.Add(r.lease)),
				budget, m.Name, periodKey(&m, now), m.Name, exp, budget,
				m.TPM, m.Name, ms(now.Add(-RateWindow)), m.Name, tokens, m.TPM,
			).Scan(&res.ID)
			if !errors.Is(err, sql.ErrNoRows) {
				return err
			}
			if refusal, err = r.refusal(tx, m, now, tokens, usd); err != nil || refusal != nil {
				return err
			}
		}
		return errors.New("the admission found no room but no limit is reached")
	})
	if err != nil {
		return nil, fmt.Errorf("registry: reserving for %s: %w", m.Name, err)
	}
	if refusal != nil {
		return nil, refusal
	}
	r.live.Add(1)
	return res, nil
}

// refusal explains why the conditional insert of Reserve found no room.
func (r *Registry) refusal(tx q, m Member, now time.Time, tokens int, usdAmount float64) (refusal, err error) {
	var heldNUSD, heldTokens int64
	if err := tx.row(`SELECT COALESCE(SUM(nusd), 0), COALESCE(SUM(tokens), 0) FROM reservations WHERE member = ?`,
		m.Name).Scan(&heldNUSD, &heldTokens); err != nil {
		return nil, err
	}
	if m.BudgetUSD > 0 {
		spent, err := r.spent(tx.row(spentQuery, m.Name, periodKey(&m, now)), m)
		if err != nil {
			return nil, err
		}
		if spent+heldNUSD+nusd(usdAmount) > nusd(m.BudgetUSD) {
			_, end := m.PeriodAt(now)
			return &OverBudget{BudgetUSD: m.BudgetUSD, SpentUSD: usd(spent), ReservedUSD: usd(heldNUSD), ExpectedUSD: usdAmount, End: end}, nil
		}
	}
	return r.tokensRefusal(tx, m, now, int(heldTokens), tokens)
}

// Release frees what the reservation still holds (nothing once its records
// settled all of it). Idempotent; safe on a nil reservation. The
// reservation's row is deleted, so Release needs the database: on an error
// the row stays until its lease expires.
func (res *Reservation) Release(ctx context.Context) error {
	if res == nil || res.ID == 0 || !res.released.CompareAndSwap(false, true) {
		return nil
	}
	res.r.live.Add(-1)
	if res.r.releaseJournaled(ctx, res.ID) {
		return nil // after the records that settle it (journal.go)
	}
	if _, err := res.r.exec(ctx, qRelease, res.ID, res.r.owner); err != nil {
		return fmt.Errorf("registry: releasing reservation %d of %s: %w", res.ID, res.Member, err)
	}
	return nil
}

// Held returns what live (unexpired) reservations of member hold now:
// cost in USD and tokens.
func (r *Registry) Held(ctx context.Context, member string) (usdHeld float64, tokens int, err error) {
	if err := r.syncJournal(ctx); err != nil {
		return 0, 0, err
	}
	var n, t int64
	err = r.db.QueryRowContext(ctx, `SELECT COALESCE(SUM(nusd), 0), COALESCE(SUM(tokens), 0) FROM reservations WHERE member = ? AND expires > ?`,
		member, ms(r.now())).Scan(&n, &t)
	if err != nil {
		return 0, 0, fmt.Errorf("registry: reading reservations of %s: %w", member, err)
	}
	return usd(n), int(t), nil
}
