// Package keyauth authenticates Molly API keys against the registry: the
// member a key belongs to, its scopes, its remaining budget and its RPM/TPM
// admission become the identity.Identity a request runs under, with a
// ledger that reserves the request's worst case and records its usage in
// the registry. Refusals are OpenAI's error shapes: 401 invalid_api_key,
// 429 insufficient_quota, 429 rate_limit_exceeded with Retry-After. The
// molly_auth handler (caddy-modules/auth) and the ext_proc policy point
// (package envoy) both authenticate through it, so a key means the same on
// one box and in a fleet.
package keyauth

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/molly-gateway/molly/registry"
	"github.com/molly-gateway/molly/router/identity"
	"github.com/molly-gateway/molly/router/meter"
	"github.com/molly-gateway/molly/router/observe"
	"github.com/molly-gateway/molly/router/openai"
)

// Authenticator turns API keys into identities. Its fields are set once
// before use; safe for concurrent use.
type Authenticator struct {
	Registry *registry.Registry
	// Anonymous, when set, serves requests without a Molly key as this
	// member (it must exist): for local use. A request presenting a key
	// that looks like a Molly key (sk-molly-…) must still present a valid
	// one. Without it, every request needs a key.
	Anonymous string
}

// Authenticate returns the identity of a request that presented key
// (hasKey false: none), after the member's budget and RPM/TPM admission.
// A refusal is an *openai.Error (401 invalid_api_key; 429
// insufficient_quota; 429 rate_limit_exceeded, with Retry-After unless
// the request can never fit, then with x-should-retry: false) returned with the header to send along
// (WWW-Authenticate for a 401, X-Ratelimit-Limit-<Kind> and
// X-Ratelimit-Remaining-<Kind> for a rate limit). Other errors are the
// registry's. The key is never logged nor put in an error.
func (a *Authenticator) Authenticate(ctx context.Context, key string, hasKey bool) (*identity.Identity, http.Header, error) {
	var m registry.Member
	var k registry.Key
	var err error
	switch {
	case a.Anonymous != "" && (!hasKey || !strings.HasPrefix(key, registry.KeyPrefix)):
		m, err = a.Registry.Member(ctx, a.Anonymous)
	case !hasKey:
		return nil, unauthorizedHeader(), Unauthorized("You didn't provide an API key. Send it as Authorization: Bearer <key>; an administrator creates keys with `molly keys create`.")
	default:
		m, k, err = a.Registry.Lookup(ctx, key)
		if errors.Is(err, registry.ErrUnknownKey) || errors.Is(err, registry.ErrRevokedKey) {
			return nil, unauthorizedHeader(), Unauthorized("Incorrect API key provided. An administrator creates keys with `molly keys create`.")
		}
	}
	if err != nil {
		return nil, nil, err
	}
	remaining, budgeted, err := a.Registry.Remaining(ctx, m)
	if err != nil {
		return nil, nil, err
	}
	if budgeted && remaining <= 0 {
		return nil, nil, OverBudget(m, "")
	}
	lim, err := a.Registry.Admit(ctx, m)
	if err != nil {
		return nil, nil, err
	}
	if lim != nil {
		h := http.Header{}
		h.Set("X-Ratelimit-Limit-"+titleKind(lim.Kind), strconv.Itoa(lim.Limit))
		h.Set("X-Ratelimit-Remaining-"+titleKind(lim.Kind), "0")
		return nil, h, RateLimited(m, lim)
	}
	return &identity.Identity{Member: m.Name, KeyPrefix: k.Prefix, Models: m.Models, Tiers: m.Tiers, Tools: m.Tools, TPM: m.TPM,
		Budgeted: budgeted, RemainingUSD: remaining, Ledger: &Ledger{Registry: a.Registry, Member: m}}, nil, nil
}

func titleKind(kind string) string { return strings.ToUpper(kind[:1]) + kind[1:] }

// Key returns the API key a request presents: the token of its
// "Authorization: Bearer" header (Bearer), else its "x-api-key" header,
// which Anthropic's clients send.
func Key(h http.Header) (string, bool) {
	if a := h.Get("Authorization"); a != "" {
		return Bearer(a)
	}
	k := strings.TrimSpace(h.Get("X-Api-Key"))
	return k, k != ""
}

// Bearer returns the token of an "Authorization: Bearer <token>" header
// value (RFC 6750 §2.1; the scheme is case-insensitive).
func Bearer(authorization string) (string, bool) {
	scheme, token, ok := strings.Cut(authorization, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return "", false
	}
	token = strings.TrimSpace(token)
	return token, token != ""
}

// Unauthorized is the 401 invalid_api_key with msg; send it with
// WWW-Authenticate: Bearer realm="molly" (Authenticate's header).
func Unauthorized(msg string) *openai.Error {
	return &openai.Error{Status: http.StatusUnauthorized, Type: "invalid_request_error", Code: "invalid_api_key", Message: msg}
}

func unauthorizedHeader() http.Header {
	return http.Header{"Www-Authenticate": {`Bearer realm="molly"`}}
}

// OverBudget is the 429 insufficient_quota of member m; detail, when set,
// says why the request does not fit what is left.
func OverBudget(m registry.Member, detail string) *openai.Error {
	msg := fmt.Sprintf("You exceeded your budget of %g USD", m.BudgetUSD)
	if detail != "" { // refused at the reservation: the budget is not spent, the request does not fit
		msg = fmt.Sprintf("This request does not fit in what is left of your budget of %g USD", m.BudgetUSD)
	}
	if _, end := m.PeriodAt(time.Now()); !end.IsZero() {
		msg += fmt.Sprintf(" for this %s; it renews at %s", m.Period, end.Format("2006-01-02T15:04:05Z"))
	}
	if detail != "" {
		msg += " (" + detail + ")"
	}
	// A spent budget does not come back by retrying: x-should-retry: false.
	return &openai.Error{Status: http.StatusTooManyRequests, Type: "insufficient_quota", Code: "insufficient_quota", Message: msg + ".", NoRetry: true}
}

// RateLimited is the 429 rate_limit_exceeded of member m, with
// Retry-After (whole seconds, at least 1) until the window admits it; a
// request larger than the limit itself gets no Retry-After but
// x-should-retry: false — waiting does not help, and without it the SDKs
// retry a 429 on their own backoff, to be refused again.
func RateLimited(m registry.Member, lim *registry.Limited) *openai.Error {
	e := &openai.Error{Status: http.StatusTooManyRequests, Type: lim.Kind, Code: "rate_limit_exceeded",
		Message: "Rate limit reached for member " + m.Name + ": " + lim.Error() + "."}
	if lim.TooLarge {
		e.NoRetry = true
	} else {
		e.RetryAfter = max(int(math.Ceil(lim.RetryAfter.Seconds())), 1)
	}
	return e
}

// Ledger is one request's: it holds, through Reserve, the worst case of
// the request of Member in the registry, and records the request's usage
// there, each record settling the request's latest reservation in its
// transaction.
type Ledger struct {
	Registry *registry.Registry
	Member   registry.Member

	mu   sync.Mutex
	held []*registry.Reservation // this request's live reservations, latest last
}

// releaseTimeout bounds the release of a reservation; past it the row stays
// until its lease expires.
const releaseTimeout = 5 * time.Second

// Reserve implements meter.Reserver: tokens and expectedUSD are the
// request's worst case; the refusals are *openai.Error 429s (OverBudget,
// RateLimited), a registry failure a 500 internal_error.
func (l *Ledger) Reserve(ctx context.Context, tokens int, expectedUSD float64) (func(), error) {
	res, err := l.Registry.Reserve(ctx, l.Member, tokens, expectedUSD)
	var ob *registry.OverBudget
	var lim *registry.Limited
	switch {
	case errors.As(err, &ob):
		observe.DefaultMetrics.Refused("budget", "reservation")
		return nil, OverBudget(l.Member, fmt.Sprintf("it may cost up to %.6g USD; %.6g are spent and %.6g held by requests in flight",
			ob.ExpectedUSD, ob.SpentUSD, ob.ReservedUSD))
	case errors.As(err, &lim):
		observe.DefaultMetrics.Refused("rate_"+lim.Kind, "reservation")
		return nil, RateLimited(l.Member, lim)
	case err != nil:
		return nil, &openai.Error{Status: http.StatusInternalServerError, Type: "server_error", Code: "internal_error", Message: "The usage ledger failed; try again."}
	}
	l.mu.Lock()
	l.held = append(l.held, res)
	l.mu.Unlock()
	return func() {
		l.mu.Lock()
		l.held = slices.DeleteFunc(l.held, func(r *registry.Reservation) bool { return r == res })
		l.mu.Unlock()
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), releaseTimeout)
		defer cancel()
		_ = res.Release(ctx) // on failure the lease expires it
	}, nil
}

// Record implements meter.Ledger: the usage goes to the registry's usage
// journal (registry.Registry.Journal: durable when Record returns, in the
// ledger a moment later), settling the request's latest reservation.
func (l *Ledger) Record(ctx context.Context, u meter.Usage) error {
	var res int64
	l.mu.Lock()
	if n := len(l.held); n > 0 {
		res = l.held[n-1].ID
	}
	l.mu.Unlock()
	return l.Registry.Journal(ctx, RegistryUsage(u, res))
}

// RegistryUsage converts a router usage record for the registry; res, when
// not 0, is the reservation it settles.
func RegistryUsage(u meter.Usage, res int64) registry.Usage {
	return registry.Usage{Member: u.Member, DecisionID: u.DecisionID, Model: u.Model, Target: u.Target, Tier: u.Tier,
		PromptTokens: u.PromptTokens, CompletionTokens: u.CompletionTokens, Estimated: u.Estimated, CostUSD: u.CostUSD, Time: u.Time,
		Reservation: res}
}

// Interface guards.
var (
	_ meter.Ledger   = (*Ledger)(nil)
	_ meter.Reserver = (*Ledger)(nil)
)
