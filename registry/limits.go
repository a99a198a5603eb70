package registry

import (
	"fmt"
	"time"
)

// RateWindow is the span RPM and TPM limits count over: a trailing minute
// (a sliding log, so there is no burst at a fixed minute's boundary).
const RateWindow = time.Minute

// Limited says why Admit refused a request.
type Limited struct {
	// Kind is "requests" (RPM) or "tokens" (TPM), as in OpenAI's rate-limit errors.
	Kind string
	// Limit is the member's RPM or TPM; Used what the trailing minute holds.
	Limit, Used int
	// RetryAfter is how long until the request would be admitted.
	RetryAfter time.Duration
	// Requested is the request's own expected tokens (Reserve); TooLarge
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

// window is one member's trailing minute: admitted requests and recorded tokens.
type window struct {
	reqs   []time.Time
	tokens []tokenEntry
}

type tokenEntry struct {
	at time.Time
	n  int
}

func (w *window) prune(now time.Time) {
	cut := now.Add(-RateWindow)
	i := 0
	for i < len(w.reqs) && !w.reqs[i].After(cut) {
		i++
	}
	w.reqs = w.reqs[i:]
	j := 0
	for j < len(w.tokens) && !w.tokens[j].at.After(cut) {
		j++
	}
	w.tokens = w.tokens[j:]
}

// Admit applies m's RPM and TPM limits at the current time and, when the
// request may go, counts it; otherwise it returns why not and when to retry.
// TPM counts the tokens recorded in the trailing minute; a request's own
// expected tokens are checked, and held while it runs, by Reserve. Windows live in memory: requests counted before a restart are
// forgotten, recorded tokens are reloaded from the ledger by Open.
func (r *Registry) Admit(m Member) *Limited {
	if m.RPM <= 0 && m.TPM <= 0 {
		return nil
	}
	now := r.now()
	r.mu.Lock()
	defer r.mu.Unlock()
	w := r.win(m.Name)
	w.prune(now)
	if m.RPM > 0 && len(w.reqs) >= m.RPM {
		// The oldest request that must leave the window for one slot to free.
		oldest := w.reqs[len(w.reqs)-m.RPM]
		return &Limited{Kind: "requests", Limit: m.RPM, Used: len(w.reqs), RetryAfter: oldest.Add(RateWindow).Sub(now)}
	}
	if m.TPM > 0 {
		used := 0
		for _, t := range w.tokens {
			used += t.n
		}
		if used >= m.TPM {
			left := used
			var at time.Time
			for _, t := range w.tokens {
				left -= t.n
				at = t.at
				if left < m.TPM {
					break
				}
			}
			return &Limited{Kind: "tokens", Limit: m.TPM, Used: used, RetryAfter: at.Add(RateWindow).Sub(now)}
		}
	}
	if m.RPM > 0 {
		w.reqs = append(w.reqs, now)
	}
	return nil
}

func (r *Registry) win(member string) *window {
	w, ok := r.windows[member]
	if !ok {
		w = &window{}
		r.windows[member] = w
	}
	return w
}

func (r *Registry) addTokens(member string, at time.Time, n int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	w := r.win(member)
	w.prune(r.now())
	w.tokens = append(w.tokens, tokenEntry{at, n})
}

// loadWindows refills the TPM windows from the ledger's last minute.
func (r *Registry) loadWindows() error {
	rows, err := r.db.Query(`SELECT member, ts, prompt_tokens + completion_tokens FROM usage WHERE ts > ? ORDER BY ts`,
		ms(r.now().Add(-RateWindow)))
	if err != nil {
		return fmt.Errorf("registry: loading the last minute of usage: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var member string
		var ts int64
		var n int
		if err := rows.Scan(&member, &ts, &n); err != nil {
			return fmt.Errorf("registry: loading the last minute of usage: %w", err)
		}
		w := r.win(member)
		w.tokens = append(w.tokens, tokenEntry{fromMS(ts), n})
	}
	return rows.Err()
}
