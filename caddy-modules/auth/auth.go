// Package auth is the Caddy handler http.handlers.molly_auth: it turns the
// request's API key into a identity.Identity (member, scopes, remaining
// budget) and refuses, in OpenAI's error shapes, requests without a valid
// key (401), over budget (429 insufficient_quota) or over their rate limits
// (429 rate_limit_exceeded with Retry-After); on Anthropic's Messages API
// (POST …/messages) the same refusals are Anthropic's error bodies,
// {"type":"error","error":{"type":"authentication_error"|"rate_limit_error"|…,"message"}}. Members, keys and the usage
// ledger live in the registry (SQLite), the molly app's (its `registry`
// option); this package is the glue, plus the admin API routes
// (admin.api.molly_keys) and the `molly keys` command.
package auth

import (
	"errors"
	"fmt"
	"net/http"
	"path/filepath"
	"strings"
	"sync/atomic"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/zap"

	"github.com/molly-gateway/molly/caddy-modules/app"
	"github.com/molly-gateway/molly/registry"
	"github.com/molly-gateway/molly/registry/postgres"
	"github.com/molly-gateway/molly/router/identity"
	"github.com/molly-gateway/molly/router/keyauth"
	"github.com/molly-gateway/molly/router/openai"
	"github.com/molly-gateway/molly/router/tracing"
	"github.com/molly-gateway/molly/router/translate"
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
		db := au.DB
		if !postgres.IsDSN(db) {
			if db, err = filepath.Abs(au.DB); err != nil {
				return fmt.Errorf("molly_auth: db %s: %w", au.DB, err)
			}
		}
		if db != path {
			shown, appShown := postgres.Redact(db), postgres.Redact(path)
			return fmt.Errorf("molly_auth: db %s is not the registry of the molly app (%s): members, keys, usage and priors live in one registry; "+
				"set `registry %s` in the global molly option and drop db here (db is only an alias of that file)", shown, appShown, shown)
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
	openai.RequestID(w, r)
	ctx := r.Context()
	_, span := tracing.Start(ctx, "molly.auth", trace.SpanKindInternal)
	defer span.End() // a no-op once ended below
	key, hasKey := keyauth.Key(r.Header)
	r.Header.Del("Authorization")
	r.Header.Del("X-Api-Key")
	id, hdr, err := (&keyauth.Authenticator{Registry: au.reg, Anonymous: au.Anonymous}).Authenticate(ctx, key, hasKey)
	for k, v := range hdr {
		w.Header()[k] = v
	}
	var refusal *openai.Error
	if errors.As(err, &refusal) {
		if ep, _ := openai.EndpointOf(r.Method, r.URL.Path); ep == openai.EndpointMessages || strings.HasSuffix(strings.TrimSuffix(r.URL.Path, "/"), "/messages/count_tokens") ||
			ep == openai.EndpointModels && translate.AnthropicClient(r) {
			// Anthropic's clients get Anthropic's error body (same status
			// and headers), as the Messages handler writes its own errors;
			// so does an Anthropic client listing models.
			tw := translate.NewWriter(w, ctx, translate.APIMessages)
			refusal.Write(tw)
			tw.Finish()
		} else {
			refusal.Write(w)
		}
		refused(span, refusalReason(refusal, hasKey))
		return nil
	}
	if err != nil {
		return app.InternalError(w, r, au.logger, fmt.Errorf("molly_auth: %w", err))
	}
	authenticated(span, id.Member)
	return next.ServeHTTP(w, r.WithContext(identity.With(ctx, id)))
}

// refusalReason is the metrics class of an admission refusal.
func refusalReason(e *openai.Error, hasKey bool) string {
	switch e.Code {
	case "invalid_api_key":
		if !hasKey {
			return "missing_key"
		}
		return "invalid_key"
	case "insufficient_quota":
		return "budget"
	case "rate_limit_exceeded":
		return "rate_" + e.Type
	}
	return e.Code
}

// Interface guards.
var (
	_ caddy.Provisioner           = (*Auth)(nil)
	_ caddy.Validator             = (*Auth)(nil)
	_ caddy.CleanerUpper          = (*Auth)(nil)
	_ caddyhttp.MiddlewareHandler = (*Auth)(nil)
)
