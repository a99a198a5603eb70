package app

import (
	"errors"
	"net/http"

	"github.com/caddyserver/caddy/v2"

	"github.com/molly-gateway/molly/caddy-modules/admin"
)

// FederationAdmin is the admin API module admin.api.molly_federation,
// under Caddy's admin endpoint (Molly's default: a Unix socket, mode
// 0600): the federation roles of the molly app (learning/federation).
//
//	POST /molly/federation/run     {"domains": [...]} (optional; default every domain with a
//	                               local adapter version): contribute each domain's delta, wait
//	                               for its round to close, pull the aggregate and adopt it through
//	                               the specialisation gate → [FederatedDomain] (a second run
//	                               waits for the first; 404 when this Molly is not a participant)
//	GET  /molly/federation/status  FederationStatus: role, listener and peers (aggregator),
//	                               the privacy spending, deltas sent and last runs (participant)
//
// Without a federation block every route answers 404.
type FederationAdmin struct{}

func init() { caddy.RegisterModule(FederationAdmin{}) }

// CaddyModule returns the Caddy module information.
func (FederationAdmin) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{ID: "admin.api.molly_federation", New: func() caddy.Module { return new(FederationAdmin) }}
}

// FederationRunRequest is the body of POST /molly/federation/run.
type FederationRunRequest struct {
	Domains []string `json:"domains,omitempty"`
}

// Routes returns the admin routes.
func (FederationAdmin) Routes() []caddy.AdminRoute {
	h := func(w http.ResponseWriter, r *http.Request) error {
		cur := Current()
		if cur == nil || cur.fed == nil {
			return caddy.APIError{HTTPStatus: http.StatusNotFound, Err: errors.New("federation is not configured (molly { federation { ... } })")}
		}
		return cur.serveFederation(w, r)
	}
	return []caddy.AdminRoute{{Pattern: "/molly/federation/", Handler: admin.Guard(caddy.AdminHandlerFunc(h))}}
}

func (a *App) serveFederation(w http.ResponseWriter, r *http.Request) error {
	switch r.Method + " " + r.URL.Path {
	case "GET /molly/federation/status":
		s, _ := a.FederationStatus()
		return writeJSON(w, http.StatusOK, s)
	case "POST /molly/federation/run":
		if a.fed.part == nil {
			return apiErr(http.StatusNotFound, "%v", ErrNoParticipant)
		}
		var req FederationRunRequest
		if r.ContentLength != 0 {
			if err := decodeBody(w, r, &req); err != nil {
				return err
			}
		}
		out, err := a.FederationRun(r.Context(), req.Domains)
		if err != nil {
			return apiErr(http.StatusInternalServerError, "%v", err)
		}
		if out == nil {
			out = []FederatedDomain{}
		}
		return writeJSON(w, http.StatusOK, out)
	}
	return admin.NotRouted(r, federationRoutes)
}

// federationRoutes are the methods of each federation route.
var federationRoutes = map[string][]string{
	"/molly/federation/status": {http.MethodGet},
	"/molly/federation/run":    {http.MethodPost},
}

// Interface guards.
var _ caddy.AdminRouter = FederationAdmin{}
