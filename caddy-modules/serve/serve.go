// Package serve exposes the molly app's in-process T0 engine: the Caddy
// handler http.handlers.molly_serve (the engine's OpenAI API, without the
// gateway's policy), the admin API routes under /molly/ (adapters and
// engine state), and the `molly model demo` command.
package serve

import (
	"fmt"
	"net/http"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/molly-gateway/molly/caddy-modules/app"
	"github.com/molly-gateway/molly/router/openai"
)

// Serve is the molly_serve handler: it answers with the T0 engine directly
// (POST /v1/chat/completions, POST /v1/completions, GET /v1/models,
// POST /v1/embeddings, POST and GET /molly/engine/verify for remote
// speculative decoding — drafting engines verify here and read what they
// must share, serving/README.md). It
// skips classification and policy, so expose it only where any caller may
// use the on-device model (for example on a loopback-only site).
type Serve struct {
	app *app.App
}

func init() {
	caddy.RegisterModule(Serve{})
	httpcaddyfile.RegisterHandlerDirective("molly_serve", func(h httpcaddyfile.Helper) (caddyhttp.MiddlewareHandler, error) {
		s := new(Serve)
		return s, s.UnmarshalCaddyfile(h.Dispenser)
	})
	httpcaddyfile.RegisterDirectiveOrder("molly_serve", httpcaddyfile.Before, "reverse_proxy")
}

// CaddyModule returns the Caddy module information.
func (Serve) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{ID: "http.handlers.molly_serve", New: func() caddy.Module { return new(Serve) }}
}

// Provision finds the molly app.
func (s *Serve) Provision(ctx caddy.Context) error {
	var err error
	if s.app, err = app.Load(ctx, "molly_serve"); err != nil {
		return err
	}
	if s.app.Engine() == nil {
		return fmt.Errorf("molly_serve: the molly global option declares no engine { model ... }")
	}
	return nil
}

// UnmarshalCaddyfile parses "molly_serve" (no arguments).
func (s *Serve) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	return app.NoArgs(d, "molly_serve", "the engine is configured in the global molly option")
}

// ServeHTTP hands the request to the engine.
func (s *Serve) ServeHTTP(w http.ResponseWriter, r *http.Request, _ caddyhttp.Handler) error {
	defer s.app.Serving()()
	openai.RequestID(w, r)
	e := s.app.Engine()
	if e == nil {
		(&openai.Error{Status: http.StatusServiceUnavailable, Type: "service_unavailable", Message: "No T0 engine is configured."}).Write(w)
		return nil
	}
	e.ServeHTTP(w, r)
	return nil
}

// Interface guards.
var (
	_ caddy.Provisioner           = (*Serve)(nil)
	_ caddyfile.Unmarshaler       = (*Serve)(nil)
	_ caddyhttp.MiddlewareHandler = (*Serve)(nil)
)
