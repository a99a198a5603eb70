package app

import (
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/caddyserver/caddy/v2"

	"github.com/molly-gateway/molly/caddy-modules/admin"
	"github.com/molly-gateway/molly/router/orchestrate"
)

// PlansAdmin is the admin API module admin.api.molly_plans, under Caddy's
// admin endpoint (Molly's admin socket by default): the orchestration plans the
// gateway keeps in memory (the last orchestrator plans_kept, default 256).
//
//	GET /molly/plans        the plans kept, newest first: [{"id", "created", "member", "status", "planner"}]
//	GET /molly/plans/<id>   one plan (the X-Molly-Plan-Id of an orchestrated answer): the plan, its
//	                        admission (policy verdict, worst case, budget), each subtask's tier,
//	                        target, model, decision, cost, tokens, latency, outcome, fallbacks and
//	                        alternatives, the refinements, the uncertainty, the totals
//
// Errors: 404 for a plan not kept (or orchestration off), 405 for another
// method. A plan holds its instructions (what the controller wrote):
// the admin API is the operator's, so like every Molly admin route it
// answers only on the Unix socket or the mutual-TLS remote admin endpoint
// (admin.Guard); logs never carry them.
type PlansAdmin struct{}

func init() { caddy.RegisterModule(PlansAdmin{}) }

// CaddyModule returns the Caddy module information.
func (PlansAdmin) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{ID: "admin.api.molly_plans", New: func() caddy.Module { return new(PlansAdmin) }}
}

// Routes returns the admin routes.
func (PlansAdmin) Routes() []caddy.AdminRoute {
	h := func(w http.ResponseWriter, r *http.Request) error {
		cur := Current()
		if cur == nil || cur.orchestrator == nil {
			return caddy.APIError{HTTPStatus: http.StatusNotFound, Err: errors.New("orchestration is off")}
		}
		return servePlans(w, r, cur.orchestrator.Store())
	}
	return []caddy.AdminRoute{
		{Pattern: "/molly/plans", Handler: admin.Guard(caddy.AdminHandlerFunc(h))},
		{Pattern: "/molly/plans/", Handler: admin.Guard(caddy.AdminHandlerFunc(h))},
	}
}

// servePlans answers the plans routes from s.
func servePlans(w http.ResponseWriter, r *http.Request, s *orchestrate.Store) error {
	if r.Method != http.MethodGet {
		return admin.MethodNotAllowed(r, http.MethodGet)
	}
	id, one := strings.CutPrefix(r.URL.Path, "/molly/plans/")
	if !one || id == "" {
		return writeJSON(w, http.StatusOK, s.List())
	}
	b, ok := s.JSON(id)
	if !ok {
		return caddy.APIError{HTTPStatus: http.StatusNotFound, Err: fmt.Errorf("no plan %q is kept", id)}
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	_, err := w.Write(b)
	return err
}

// Interface guard.
var _ caddy.AdminRouter = PlansAdmin{}
