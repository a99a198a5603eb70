// Package health is the Caddy handler http.handlers.molly_health: GET
// /healthz answers 200 while the process serves (liveness), GET /readyz
// answers 200 when Molly can route — the policies are compiled, the T0
// engine (when configured) is loaded, at least one target is healthy —
// and 503 otherwise, with each check in the body (readiness). Any other
// request goes to the next handler. Put it first in the site, before
// molly_auth, so probes need no key.
package health

import (
	"encoding/json"
	"net/http"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/molly-gateway/molly/caddy-modules/app"
	"github.com/molly-gateway/molly/router/egress"
	"github.com/molly-gateway/molly/router/openai"
)

// Default probe paths.
const (
	DefaultLive  = "/healthz"
	DefaultReady = "/readyz"
)

// Health is the molly_health handler.
type Health struct {
	// Live and Ready are the paths of the liveness and readiness probes
	// (default /healthz and /readyz).
	Live  string `json:"live,omitempty"`
	Ready string `json:"ready,omitempty"`

	app *app.App
}

func init() {
	caddy.RegisterModule(Health{})
	httpcaddyfile.RegisterHandlerDirective("molly_health", func(h httpcaddyfile.Helper) (caddyhttp.MiddlewareHandler, error) {
		m := new(Health)
		return m, m.UnmarshalCaddyfile(h.Dispenser)
	})
	httpcaddyfile.RegisterDirectiveOrder("molly_health", httpcaddyfile.Before, "forward_auth")
}

// CaddyModule returns the Caddy module information.
func (Health) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{ID: "http.handlers.molly_health", New: func() caddy.Module { return new(Health) }}
}

// Provision finds the molly app and sets the default paths.
func (m *Health) Provision(ctx caddy.Context) error {
	if m.Live == "" {
		m.Live = DefaultLive
	}
	if m.Ready == "" {
		m.Ready = DefaultReady
	}
	var err error
	m.app, err = app.Load(ctx, "molly_health")
	return err
}

// UnmarshalCaddyfile parses "molly_health [<live path> <ready path>]".
func (m *Health) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next()
	args := d.RemainingArgs()
	switch len(args) {
	case 0:
	case 2:
		m.Live, m.Ready = args[0], args[1]
	default:
		return d.Err("molly_health takes no arguments, or the liveness and readiness paths after a matcher: molly_health * /healthz /readyz")
	}
	if d.NextBlock(0) {
		return d.Err("molly_health takes no block")
	}
	return nil
}

// Report is the body of a readiness answer.
type Report struct {
	Status string `json:"status"` // "ready" or "not_ready"
	// Policies: the revision serving, and the last reload's error.
	Policies struct {
		OK        bool   `json:"ok"`
		Revision  string `json:"revision"`
		LastError string `json:"last_error,omitempty"`
	} `json:"policies"`
	// Engine: nil when no engine is configured.
	Engine *struct {
		OK     bool     `json:"ok"`
		Models []string `json:"models"`
	} `json:"engine,omitempty"`
	Targets []egress.TargetHealth `json:"targets"`
}

// ServeHTTP answers the two probe paths and passes the rest on.
func (m *Health) ServeHTTP(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	if r.URL.Path != m.Live && r.URL.Path != m.Ready {
		return next.ServeHTTP(w, r)
	}
	openai.RequestID(w, r)
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		openai.MethodNotAllowed(r.Method, r.URL.Path, "GET, HEAD").Write(w)
		return nil
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	if r.URL.Path == m.Live {
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write([]byte(`{"status":"alive"}`))
		return nil
	}
	rep := m.report(r)
	status := http.StatusOK
	if rep.Status != "ready" {
		status = http.StatusServiceUnavailable
	}
	b, err := json.Marshal(rep)
	if err != nil {
		return app.InternalError(w, r, m.app.Logger(), err)
	}
	w.WriteHeader(status)
	_, _ = w.Write(b)
	return nil
}

// report runs the readiness checks.
func (m *Health) report(r *http.Request) Report {
	var rep Report
	st := m.app.Policy().Status()
	rep.Policies.OK, rep.Policies.Revision, rep.Policies.LastError = st.Revision != "", st.Revision, st.LastError
	ready := rep.Policies.OK
	if e := m.app.Engine(); e != nil {
		models := e.Models()
		rep.Engine = &struct {
			OK     bool     `json:"ok"`
			Models []string `json:"models"`
		}{OK: len(models) > 0, Models: models}
		ready = ready && rep.Engine.OK
	}
	rep.Targets = m.app.Egress().Health(r.Context(), m.app.Catalogue())
	healthy := false
	for _, t := range rep.Targets {
		healthy = healthy || t.OK
	}
	rep.Status = "not_ready"
	if ready && healthy {
		rep.Status = "ready"
	}
	return rep
}

// Interface guards.
var (
	_ caddy.Provisioner           = (*Health)(nil)
	_ caddyfile.Unmarshaler       = (*Health)(nil)
	_ caddyhttp.MiddlewareHandler = (*Health)(nil)
)
