// Package route is the Caddy handler http.handlers.molly_route: it sends the
// request to the best target the policy decision allows (pipeline.Pipeline)
// and writes the answer. It is terminal: it never calls the next handler.
package route

import (
	"errors"
	"net/http"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/molly-gateway/molly/caddy-modules/app"
	"github.com/molly-gateway/molly/router/classify"
	"github.com/molly-gateway/molly/router/identity"
	"github.com/molly-gateway/molly/router/openai"
	"github.com/molly-gateway/molly/router/pipeline"
)

// Route is the molly_route handler. Targets and weights live in the molly app.
type Route struct {
	app *app.App
}

func init() {
	caddy.RegisterModule(Route{})
	httpcaddyfile.RegisterHandlerDirective("molly_route", func(h httpcaddyfile.Helper) (caddyhttp.MiddlewareHandler, error) {
		rt := new(Route)
		return rt, rt.UnmarshalCaddyfile(h.Dispenser)
	})
}

// CaddyModule returns the Caddy module information.
func (Route) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{ID: "http.handlers.molly_route", New: func() caddy.Module { return new(Route) }}
}

// Provision finds the molly app.
func (rt *Route) Provision(ctx caddy.Context) error {
	var err error
	if rt.app, err = app.Load(ctx, "molly_route"); err != nil {
		return err
	}
	return nil
}

// UnmarshalCaddyfile parses "molly_route" (no arguments).
func (rt *Route) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	return app.NoArgs(d, "molly_route", "targets are declared in the global molly option")
}

// ServeHTTP routes the request.
func (rt *Route) ServeHTTP(w http.ResponseWriter, r *http.Request, _ caddyhttp.Handler) error {
	defer rt.app.Serving()()
	openai.RequestID(w, r)
	ann := classify.From(r.Context())
	d, ok := pipeline.DecidedFrom(r.Context())
	if ann == nil || !ok {
		return app.InternalError(w, r, rt.app.Logger(), errors.New("molly_route: no annotation or decision; put molly_classify and molly_policy before molly_route"))
	}
	if identity.From(r.Context()) == nil {
		// No molly_auth: the usage is still recorded, in the registry, as "anonymous".
		r = r.WithContext(identity.With(r.Context(), rt.app.AnonymousIdentity()))
	}
	if err := rt.app.Pipeline().Serve(w, r, ann, d); err != nil {
		openai.WriteError(w, err)
	}
	return nil
}

// Interface guards.
var (
	_ caddy.Provisioner           = (*Route)(nil)
	_ caddyfile.Unmarshaler       = (*Route)(nil)
	_ caddyhttp.MiddlewareHandler = (*Route)(nil)
)
