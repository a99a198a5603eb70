// Package auth is the Caddy handler http.handlers.molly_auth: it turns the
// request's API key into a identity.Identity (member, scopes, remaining
// budget) and refuses, in OpenAI's error shapes, requests without a valid
// key (401), over budget (429 insufficient_quota) or over their rate limits
// (429 rate_limit_exceeded with Retry-After). Members, keys and the usage
// ledger live in the registry (SQLite), the molly app's (its `registry`
// option); this package is the glue, plus the admin API routes
// (admin.api.molly_keys) and the `molly keys` command.
package auth

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/molly-gateway/molly/caddy-modules/app"
	"github.com/molly-gateway/molly/registry"
	"github.com/molly-gateway/molly/router/identity"
	"github.com/molly-gateway/molly/router/meter"
	"github.com/molly-gateway/molly/router/openai"
)

// Auth is the molly_auth handler.
type Auth struct {
	// DB is kept as an alias of the molly app's registry file (its
	// `registry` option; default molly/molly.db under Caddy's data
	// directory): when set it must name the same file, else Provision
	// fails saying so. There is one registry per gateway.
	DB string `json:"db,omitempty"`
	// Anonymous, when set, serves requests without a Molly key as this
	// member (created without limits if missing): for local use. A request
	// presenting a key that looks like a Molly key (sk-molly-…) must still
	// present a valid one. Without it, every request needs a key.
	Anonymous string `json:"anonymous,omitempty"`

	reg    *registry.Registry
	path   string // the registry file, absolute
	logger *zap.Logger
}

func init() { caddy.RegisterModule(Auth{}) }

// CaddyModule returns the Caddy module information.
func (Auth) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{ID: "http.handlers.molly_auth", New: func() caddy.Module { return new(Auth) }}
}

// Provision takes the molly app's registry (shared by every handler and
// config generation using the same file) and makes sure the anonymous
// member exists.
func (au *Auth) Provision(ctx caddy.Context) error {
	au.logger = ctx.Logger()
	a, err := app.Load(ctx, "molly_auth")
	if err != nil {
		return err
	}
	path := a.RegistryPath()
	if au.DB != "" {
		db, err := filepath.Abs(au.DB)
		if err != nil {
			return fmt.Errorf("molly_auth: db %s: %w", au.DB, err)
		}
		if db != path {
			return fmt.Errorf("molly_auth: db %s is not the registry of the molly app (%s): members, keys, usage and priors live in one registry; "+
				"set `registry %s` in the global molly option and drop db here (db is only an alias of that file)", db, path, db)
		}
	}
	if au.reg, err = app.AcquireRegistry(path); err != nil {
		return fmt.Errorf("molly_auth: %w", err)
	}
	au.path = path
	active.Store(au.reg)
	if au.Anonymous != "" {
		if _, err := au.reg.Member(ctx, au.Anonymous); errors.Is(err, registry.ErrNotFound) {
			if _, _, err := au.reg.PutMember(ctx, registry.Member{Name: au.Anonymous}); err != nil {
				return fmt.Errorf("molly_auth: anonymous member: %w", err)
			}
		} else if err != nil {
			return fmt.Errorf("molly_auth: anonymous member: %w", err)
		}
	}
	return nil
}

// Validate rejects an anonymous member name the registry would refuse.
func (au *Auth) Validate() error {
	if au.Anonymous != "" {
		m := registry.Member{Name: au.Anonymous}
		if err := m.Validate(); err != nil {
			return fmt.Errorf("molly_auth: anonymous: %w", err)
		}
	}
	return nil
}

// Cleanup releases this handler's use of the registry; the file closes with
// the last user.
func (au *Auth) Cleanup() error {
	if au.reg == nil {
		return nil
	}
	closed, err := app.ReleaseRegistry(au.path)
	if closed {
		active.CompareAndSwap(au.reg, nil)
	}
	return err
}

// active is the registry the admin API manages: the latest provisioned.
var active atomic.Pointer[registry.Registry]

// ServeHTTP authenticates the request and calls next with the identity in
// the context. The key is never logged nor echoed, and is removed from the
// request before next sees it.
func (au *Auth) ServeHTTP(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	ctx := r.Context()
	key, hasKey := bearer(r)
	r.Header.Del("Authorization")
	var m registry.Member
	var err error
	switch {
	case au.Anonymous != "" && (!hasKey || !strings.HasPrefix(key, registry.KeyPrefix)):
		m, err = au.reg.Member(ctx, au.Anonymous)
	case !hasKey:
		unauthorized(w, "You didn't provide an API key. Send it as Authorization: Bearer <key>; an administrator creates keys with `molly keys create`.")
		return nil
	default:
		m, _, err = au.reg.Lookup(ctx, key)
		if errors.Is(err, registry.ErrUnknownKey) || errors.Is(err, registry.ErrRevokedKey) {
			unauthorized(w, "Incorrect API key provided. An administrator creates keys with `molly keys create`.")
			return nil
		}
	}
	if err != nil {
		return caddyhttp.Error(http.StatusInternalServerError, fmt.Errorf("molly_auth: %w", err))
	}
	remaining, budgeted, err := au.reg.Remaining(ctx, m)
	if err != nil {
		return caddyhttp.Error(http.StatusInternalServerError, fmt.Errorf("molly_auth: %w", err))
	}
	if budgeted && remaining <= 0 {
		overBudget(m, "").Write(w)
		return nil
	}
	lim, err := au.reg.Admit(ctx, m)
	if err != nil {
		return caddyhttp.Error(http.StatusInternalServerError, fmt.Errorf("molly_auth: %w", err))
	}
	if lim != nil {
		w.Header().Set("X-Ratelimit-Limit-"+titleKind(lim.Kind), strconv.Itoa(lim.Limit))
		w.Header().Set("X-Ratelimit-Remaining-"+titleKind(lim.Kind), "0")
		rateLimited(m, lim).Write(w)
		return nil
	}
	id := &identity.Identity{Member: m.Name, Models: m.Models, Tiers: m.Tiers, Tools: m.Tools,
		Budgeted: budgeted, RemainingUSD: remaining, TPM: m.TPM, Ledger: &ledger{reg: au.reg, m: m}}
	return next.ServeHTTP(w, r.WithContext(identity.With(ctx, id)))
}

func titleKind(kind string) string { return strings.ToUpper(kind[:1]) + kind[1:] }

// bearer returns the token of an "Authorization: Bearer <token>" header
// (RFC 6750 §2.1; the scheme is case-insensitive).
func bearer(r *http.Request) (string, bool) {
	h := r.Header.Get("Authorization")
	scheme, token, ok := strings.Cut(h, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return "", false
	}
	token = strings.TrimSpace(token)
	return token, token != ""
}

func unauthorized(w http.ResponseWriter, msg string) {
	w.Header().Set("WWW-Authenticate", `Bearer realm="molly"`)
	(&openai.Error{Status: http.StatusUnauthorized, Type: "invalid_request_error", Code: "invalid_api_key", Message: msg}).Write(w)
}

// overBudget is the 429 insufficient_quota of member m; detail, when set,
// says why the request does not fit what is left.
func overBudget(m registry.Member, detail string) *openai.Error {
	msg := fmt.Sprintf("You exceeded your budget of %g USD", m.BudgetUSD)
	if _, end := m.PeriodAt(time.Now()); !end.IsZero() {
		msg += fmt.Sprintf(" for this %s; it renews at %s", m.Period, end.Format("2006-01-02T15:04:05Z"))
	}
	if detail != "" {
		msg += " (" + detail + ")"
	}
	return &openai.Error{Status: http.StatusTooManyRequests, Type: "insufficient_quota", Code: "insufficient_quota", Message: msg + "."}
}

// rateLimited is the 429 rate_limit_exceeded of member m; a request larger
// than the limit itself gets no Retry-After (waiting does not help).
func rateLimited(m registry.Member, lim *registry.Limited) *openai.Error {
	e := &openai.Error{Status: http.StatusTooManyRequests, Type: lim.Kind, Code: "rate_limit_exceeded",
		Message: "Rate limit reached for member " + m.Name + ": " + lim.Error() + "."}
	if !lim.TooLarge {
		e.RetryAfter = max(int(math.Ceil(lim.RetryAfter.Seconds())), 1)
	}
	return e
}

// ledger is one request's: it holds, through Reserve, the worst case of
// member m's request in the registry, and records the request's usage
// there, each record settling the reservation in its transaction.
type ledger struct {
	reg *registry.Registry
	m   registry.Member

	mu   sync.Mutex
	held []*registry.Reservation // this request's live reservations, latest last
}

// releaseTimeout bounds the release of a reservation; past it the row stays
// until its lease expires.
const releaseTimeout = 5 * time.Second

// Reserve implements meter.Reserver: tokens and expectedUSD are the
// request's worst case; the refusals are *openai.Error 429s.
func (l *ledger) Reserve(ctx context.Context, tokens int, expectedUSD float64) (func(), error) {
	res, err := l.reg.Reserve(ctx, l.m, tokens, expectedUSD)
	var ob *registry.OverBudget
	var lim *registry.Limited
	switch {
	case errors.As(err, &ob):
		return nil, overBudget(l.m, fmt.Sprintf("this request may cost up to %.6f USD; %.6f are spent and %.6f held by requests in flight",
			ob.ExpectedUSD, ob.SpentUSD, ob.ReservedUSD))
	case errors.As(err, &lim):
		return nil, rateLimited(l.m, lim)
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

// Record implements meter.Ledger: the usage goes to the registry, settling
// the request's latest reservation.
func (l *ledger) Record(ctx context.Context, u meter.Usage) error {
	var res int64
	l.mu.Lock()
	if n := len(l.held); n > 0 {
		res = l.held[n-1].ID
	}
	l.mu.Unlock()
	_, err := l.reg.Record(ctx, app.RegistryUsage(u, res))
	return err
}

// Interface guards.
var (
	_ caddy.Provisioner           = (*Auth)(nil)
	_ caddy.Validator             = (*Auth)(nil)
	_ caddy.CleanerUpper          = (*Auth)(nil)
	_ caddyhttp.MiddlewareHandler = (*Auth)(nil)
	_ meter.Ledger                = (*ledger)(nil)
	_ meter.Reserver              = (*ledger)(nil)
)
