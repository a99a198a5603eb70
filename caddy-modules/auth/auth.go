// Package auth is the Caddy handler http.handlers.molly_auth: it turns the
// request's API key into a identity.Identity (member, scopes, remaining
// budget) and refuses, in OpenAI's error shapes, requests without a valid
// key (401), over budget (429 insufficient_quota) or over their rate limits
// (429 rate_limit_exceeded with Retry-After). Members, keys and the usage
// ledger live in the registry (SQLite); this package is the glue, plus the
// admin API routes (admin.api.molly_keys) and the `molly keys` command.
package auth

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/molly-gateway/molly/registry"
	"github.com/molly-gateway/molly/router/identity"
	"github.com/molly-gateway/molly/router/meter"
	"github.com/molly-gateway/molly/router/openai"
)

// Auth is the molly_auth handler.
type Auth struct {
	// DB is the registry file (SQLite). Default: molly/molly.db under
	// Caddy's data directory (caddy.AppDataDir, e.g. ~/.local/share/caddy).
	DB string `json:"db,omitempty"`
	// Anonymous, when set, serves requests without a Molly key as this
	// member (created without limits if missing): for local use. A request
	// presenting a key that looks like a Molly key (sk-molly-…) must still
	// present a valid one. Without it, every request needs a key.
	Anonymous string `json:"anonymous,omitempty"`

	reg    *registry.Registry
	logger *zap.Logger
}

func init() { caddy.RegisterModule(Auth{}) }

// CaddyModule returns the Caddy module information.
func (Auth) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{ID: "http.handlers.molly_auth", New: func() caddy.Module { return new(Auth) }}
}

// Provision opens the registry (shared by every handler and config
// generation using the same file) and makes sure the anonymous member exists.
func (au *Auth) Provision(ctx caddy.Context) error {
	au.logger = ctx.Logger()
	if au.DB == "" {
		au.DB = DefaultDB()
	}
	path, err := filepath.Abs(au.DB)
	if err != nil {
		return fmt.Errorf("molly_auth: db %s: %w", au.DB, err)
	}
	au.DB = path
	v, _, err := registries.LoadOrNew(path, func() (caddy.Destructor, error) {
		reg, err := registry.Open(path, registry.Options{})
		if err != nil {
			return nil, err
		}
		return pooled{reg}, nil
	})
	if err != nil {
		return fmt.Errorf("molly_auth: %w", err)
	}
	au.reg = v.(pooled).Registry
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
	deleted, err := registries.Delete(au.DB)
	if deleted {
		active.CompareAndSwap(au.reg, nil)
	}
	return err
}

// DefaultDB is the registry file used when molly_auth names none.
func DefaultDB() string { return filepath.Join(caddy.AppDataDir(), "molly", "molly.db") }

// registries holds the open registry files by absolute path, so that a
// config reload keeps the same registry (and its rate-limit windows).
var registries = caddy.NewUsagePool()

type pooled struct{ *registry.Registry }

func (p pooled) Destruct() error { return p.Close() }

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
	if lim := au.reg.Admit(m); lim != nil {
		w.Header().Set("X-Ratelimit-Limit-"+titleKind(lim.Kind), strconv.Itoa(lim.Limit))
		w.Header().Set("X-Ratelimit-Remaining-"+titleKind(lim.Kind), "0")
		rateLimited(m, lim).Write(w)
		return nil
	}
	id := &identity.Identity{Member: m.Name, Models: m.Models, Tiers: m.Tiers, Tools: m.Tools,
		Budgeted: budgeted, RemainingUSD: remaining, Ledger: ledger{au.reg, m}}
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

// ledger records the router's usage in the registry and holds, through
// Reserve, the budget and tokens of member m's requests in flight.
type ledger struct {
	reg *registry.Registry
	m   registry.Member
}

// Reserve implements meter.Reserver: the refusals are *openai.Error 429s.
func (l ledger) Reserve(ctx context.Context, tokens int, expectedUSD float64) (func(), error) {
	release, err := l.reg.Reserve(ctx, l.m, tokens, expectedUSD)
	var ob *registry.OverBudget
	var lim *registry.Limited
	switch {
	case errors.As(err, &ob):
		return nil, overBudget(l.m, fmt.Sprintf("this request is expected to cost %.6f USD; %.6f are spent and %.6f held by requests in flight",
			ob.ExpectedUSD, ob.SpentUSD, ob.ReservedUSD))
	case errors.As(err, &lim):
		return nil, rateLimited(l.m, lim)
	case err != nil:
		return nil, &openai.Error{Status: http.StatusInternalServerError, Type: "server_error", Code: "internal_error", Message: "The usage ledger failed; try again."}
	}
	return release, nil
}

func (l ledger) Record(ctx context.Context, u meter.Usage) error {
	return l.reg.Record(ctx, registry.Usage{Member: u.Member, DecisionID: u.DecisionID, Model: u.Model, Target: u.Target, Tier: u.Tier,
		PromptTokens: u.PromptTokens, CompletionTokens: u.CompletionTokens, Estimated: u.Estimated, CostUSD: u.CostUSD, Time: u.Time})
}

// Interface guards.
var (
	_ caddy.Provisioner           = (*Auth)(nil)
	_ caddy.Validator             = (*Auth)(nil)
	_ caddy.CleanerUpper          = (*Auth)(nil)
	_ caddyhttp.MiddlewareHandler = (*Auth)(nil)
	_ meter.Ledger                = ledger{}
	_ meter.Reserver              = ledger{}
)
