// Package console is the Caddy glue of Molly's live console
// (router/console): the handler http.handlers.molly_console, which serves
// the page and its state on a site path to members named in its config,
// and the admin API module admin.api.molly_console, which serves the state
// as JSON under Caddy's admin endpoint (GET /molly/console/state) with the
// admin endpoint's own access control.
//
// The page is not served on the admin endpoint: Caddy's admin server
// refuses requests carrying Sec-Fetch-Mode without an Origin or Referer it
// allows, which is every top-level browser navigation.
package console

import (
	"crypto/subtle"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/molly-gateway/molly/caddy-modules/admin"
	"github.com/molly-gateway/molly/caddy-modules/app"
	"github.com/molly-gateway/molly/registry"
	"github.com/molly-gateway/molly/router/console"
	"github.com/molly-gateway/molly/router/keyauth"
	"github.com/molly-gateway/molly/router/openai"
)

// Console is the molly_console handler. GET <path> is the page (static: it
// holds no data and needs no key); GET <path>/state is the state, for a
// request whose "Authorization: Bearer <key>" is a valid key of one of
// Members (401 otherwise, 403 for another member's key). The page asks for
// the key and keeps it in the browser tab's session storage; a link may
// carry it as #key=<key> (a fragment, never sent to the server). It is
// terminal: it never calls the next handler.
type Console struct {
	// Members may read the console with their API keys (registry members,
	// as `molly keys create` makes them). Required.
	Members []string `json:"members"`

	h      *console.Handler
	reg    *registry.Registry
	path   string
	logger *zap.Logger
}

func init() {
	caddy.RegisterModule(Console{})
	caddy.RegisterModule(Admin{})
}

// CaddyModule returns the Caddy module information.
func (Console) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{ID: "http.handlers.molly_console", New: func() caddy.Module { return new(Console) }}
}

// Provision takes the molly app's registry (to check keys) and its sources.
func (c *Console) Provision(ctx caddy.Context) error {
	c.logger = ctx.Logger()
	a, err := app.Load(ctx, "molly_console")
	if err != nil {
		return err
	}
	c.path = a.RegistryPath()
	if c.reg, err = app.AcquireRegistry(c.path); err != nil {
		return fmt.Errorf("molly_console: %w", err)
	}
	c.h = &console.Handler{Recorder: console.Default, Sources: a.ConsoleSources()}
	return nil
}

// Validate requires at least one member.
func (c *Console) Validate() error {
	if len(c.Members) == 0 {
		return errors.New("molly_console: members is required: name the registry members whose API keys may read the console")
	}
	for _, m := range c.Members {
		mem := registry.Member{Name: m}
		if err := mem.Validate(); err != nil {
			return fmt.Errorf("molly_console: members: %w", err)
		}
	}
	return nil
}

// Cleanup releases the registry.
func (c *Console) Cleanup() error {
	if c.reg == nil {
		return nil
	}
	_, err := app.ReleaseRegistry(c.path)
	return err
}

// ServeHTTP serves the page, or the state to an allowed member's key.
func (c *Console) ServeHTTP(w http.ResponseWriter, r *http.Request, _ caddyhttp.Handler) error {
	// HEAD is answered as GET is (RFC 9110 §9.3.2): the state, its size
	// included, only to a key that may read it.
	if (r.Method == http.MethodGet || r.Method == http.MethodHead) && strings.HasSuffix(strings.TrimSuffix(r.URL.Path, "/"), "/state") {
		member, status := c.authorize(r)
		if status != 0 {
			if status == http.StatusUnauthorized {
				w.Header().Set("WWW-Authenticate", `Bearer realm="molly console"`)
			}
			refusal(status).Write(w)
			return nil
		}
		c.logger.Debug("console state", zap.String("member", member))
	}
	c.h.ServeHTTP(w, r)
	return nil
}

// refusal is the error of a state request authorize refused, in OpenAI's
// error shape: 401 invalid_api_key (sent with WWW-Authenticate), 403
// permission_denied for a member not listed, 500 server_error.
func refusal(status int) *openai.Error {
	switch status {
	case http.StatusUnauthorized:
		return keyauth.Unauthorized("The console's state needs a Molly API key of a member molly_console lists, as Authorization: Bearer <key>.")
	case http.StatusForbidden:
		return &openai.Error{Status: status, Type: "invalid_request_error", Code: "permission_denied", Message: "This key's member may not read the console."}
	}
	return &openai.Error{Status: status, Type: "server_error", Message: "The key could not be checked; try again."}
}

// authorize returns the member of the request's key, or the status to
// refuse it with. The key is never logged.
func (c *Console) authorize(r *http.Request) (string, int) {
	scheme, key, ok := strings.Cut(r.Header.Get("Authorization"), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") || strings.TrimSpace(key) == "" {
		return "", http.StatusUnauthorized
	}
	m, _, err := c.reg.Lookup(r.Context(), strings.TrimSpace(key))
	switch {
	case errors.Is(err, registry.ErrUnknownKey), errors.Is(err, registry.ErrRevokedKey):
		return "", http.StatusUnauthorized
	case err != nil:
		c.logger.Error("console key lookup", zap.Error(err))
		return "", http.StatusInternalServerError
	}
	allowed := slices.ContainsFunc(c.Members, func(name string) bool { return subtle.ConstantTimeCompare([]byte(name), []byte(m.Name)) == 1 })
	if !allowed {
		return "", http.StatusForbidden
	}
	return m.Name, 0
}

// Admin is the admin API module admin.api.molly_console:
//
//	GET /molly/console/state   the console's state (console.State) as JSON
//
// Like every Molly admin route it answers only on the Unix socket or the
// mutual-TLS remote admin endpoint (admin.Guard).
type Admin struct{}

// CaddyModule returns the Caddy module information.
func (Admin) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{ID: "admin.api.molly_console", New: func() caddy.Module { return new(Admin) }}
}

// Routes returns the admin routes.
func (Admin) Routes() []caddy.AdminRoute {
	return []caddy.AdminRoute{{Pattern: "/molly/console/state", Handler: admin.Guard(caddy.AdminHandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
		if r.Method != http.MethodGet {
			return admin.MethodNotAllowed(r, http.MethodGet)
		}
		cur := app.Current()
		if cur == nil {
			return caddy.APIError{HTTPStatus: http.StatusNotFound, Err: errors.New("no molly app is running")}
		}
		(&console.Handler{Recorder: console.Default, Sources: cur.ConsoleSources()}).ServeHTTP(w, r)
		return nil
	}))}}
}

// Interface guards.
var (
	_ caddy.Provisioner           = (*Console)(nil)
	_ caddy.Validator             = (*Console)(nil)
	_ caddy.CleanerUpper          = (*Console)(nil)
	_ caddyhttp.MiddlewareHandler = (*Console)(nil)
	_ caddy.AdminRouter           = Admin{}
)
