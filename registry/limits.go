package registry

import (
	"context"
	"fmt"
	"time"
)

// RateWindow is the span RPM and TPM limits count over: a trailing minute
// (a sliding log, so there is no burst at a fixed minute's boundary).
const RateWindow = time.Minute

// Limited says why Admit or Reserve refused a request.
type Limited struct {
	// Kind is "requests" (RPM) or "tokens" (TPM), as in OpenAI's rate-limit errors.
	Kind string
	// Limit is the member's RPM or TPM; Used what the trailing minute holds.
	Limit, Used int
	// RetryAfter is how long until the request would be admitted.
	RetryAfter time.Duration
	// Requested is the request's own worst-case tokens (Reserve); TooLarge
	// reports a request larger than the TPM itself, which waiting cannot fix.
	Requested int
	TooLarge  bool
}

func (l *Limited) Error() string {
	unit := map[string]string{"requests": "RPM", "tokens": "TPM"}[l.Kind]
	if l.TooLarge {
		return fmt.Sprintf("request too large for the %s per minute limit (%s): limit %d, requested %d; send a shorter prompt or a lower max_tokens",
			l.Kind, unit, l.Limit, l.Requested)
	}
	if l.Requested > 0 {
		return fmt.Sprintf("rate limit reached on %s per minute (%s): limit %d, used %d (recorded and in flight), requested %d; try again in %s",
			l.Kind, unit, l.Limit, l.Used, l.Requested, l.RetryAfter.Round(time.Millisecond))
	}
	return fmt.Sprintf("rate limit reached on %s per minute (%s): limit %d, used %d; try again in %s",
		l.Kind, unit, l.Limit, l.Used, l.RetryAfter.Round(time.Millisecond))
}

// Admit applies m's RPM and TPM limits at the current time and, when the
// request may go, counts it in the RPM window; otherwise it returns why not
// and when to retry (nil error). The RPM window is a table of the file
// (rate_requests), so it survives restarts and is shared by every process
// on the file; TPM counts the tokens of the usage records of the trailing
// minute (a request's own worst case is checked, and held, by Reserve).
// Errors are database errors.
func (r *Registry) Admit(ctx context.Context, m Member) (*Limited, error) {
	if m.RPM <= 0 && m.TPM <= 0 {
		return nil, nil
	}
	if m.TPM > 0 {
		if err := r.syncJournal(ctx); err != nil { // this handle's records count first
			return nil, err
		}
	}
	var lim *Limited
	err := r.txq(ctx, func(tx q) error {
		if err := tx.lock(memberLock(m.Name)); err != nil {
			return err
		}
		now := r.now() // under the write lock
		cut := ms(now.Add(-RateWindow))
		if m.RPM > 0 {
			if _, err := tx.exec(qRPMPrune, m.Name, cut); err != nil {
				return err
			}
			var n int
			if err := tx.row(qRPMCount, m.Name).Scan(&n); err != nil {
				return err
			}
			if n >= m.RPM {
				// The oldest request that must leave the window for one slot to free.
				var oldest int64
				if err := tx.row(qRPMOldest,
					m.Name, n-m.RPM).Scan(&oldest); err != nil {
					return err
				}
				lim = &Limited{Kind: "requests", Limit: m.RPM, Used: n, RetryAfter: fromMS(oldest).Add(RateWindow).Sub(now)}
				return nil
			}
		}
		if m.TPM > 0 {
			entries, used, err := tokenWindow(tx, m.Name, now)
			if err != nil {
				return err
			}
			if used >= m.TPM {
				left := used
				var at time.Time
				for _, e := range entries {
					left -= e.n
					at = e.at
					if left < m.TPM {
						break
					}
				}
				lim = &Limited{Kind: "tokens", Limit: m.TPM, Used: used, RetryAfter: at.Add(RateWindow).Sub(now)}
				return nil
			}
		}
		if m.RPM > 0 {
			_, err := tx.exec(qRPMAdmit, m.Name, ms(now))
			return err
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("registry: admitting a request of %s: %w", m.Name, err)
	}
	return lim, nil
}

// tokenEntry is one usage record in a TPM window.
type tokenEntry struct {
	at time.Time
	n  int
}

// tokenWindow returns member's usage records of the trailing minute, oldest
// first, and their tokens.
func tokenWindow(tx q, member string, now time.Time) ([]tokenEntry, int, error) {
	rows, err := tx.rows(qTokenWindow,
		member, ms(now.Add(-RateWindow)))
	if err != nil {
		return nil, 0, err
	}
	defer rows.Close()
	var out []tokenEntry
	used := 0
	for rows.Next() {
		var ts int64
		var n int
		if err := rows.Scan(&ts, &n); err != nil {
			return nil, 0, err
		}
		out = append(out, tokenEntry{fromMS(ts), n})
		used += n
	}
	return out, used, rows.Err()
}

// tokensRefusal checks that tokens more fit m's TPM window next to the
// recorded tokens and the held ones (inFlight); otherwise it says when
// enough recorded tokens leave the window (1 s when only requests in
// flight hold it). nil: they fit.
func (r *Registry) tokensRefusal(tx q, m Member, now time.Time, inFlight, tokens int) (refusal, err error) {
	if m.TPM <= 0 {
		return nil, nil
	}
	entries, recorded, err := tokenWindow(tx, m.Name, now)
	if err != nil {
		return nil, err
	}
	used := recorded + inFlight
	if used+tokens <= m.TPM {
		return nil, nil
	}
	retry := time.Second
	left := used
	for _, e := range entries {
		left -= e.n
		if left+tokens <= m.TPM {
			retry = max(e.at.Add(RateWindow).Sub(now), time.Millisecond)
			break
		}
	}
	return &Limited{Kind: "tokens", Limit: m.TPM, Used: used, Requested: tokens, RetryAfter: retry}, nil
}
