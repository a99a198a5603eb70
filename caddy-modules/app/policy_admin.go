package app

import (
	"errors"
	"net/http"

	"github.com/caddyserver/caddy/v2"

	"github.com/molly-gateway/molly/caddy-modules/admin"
)

// PolicyAdmin is the admin API module admin.api.molly_policy:
//
//	GET /molly/policy   the policy revision serving and how its directory last loaded (policies.Status):
//	                    {"revision", "loaded_at", "source" (the policy_dir, or "embedded"), "files",
//	                     "last_error" and "last_error_at" (why the newest content did not load; absent
//	                     when it did), "healthy"}
//
// 405 for another method, 404 when no molly app is running (a feature not
// configured, as every Molly admin route answers it; 503 is only transient
// capacity). Like every Molly admin route it answers only on the Unix socket or the mutual-TLS
// remote admin endpoint (admin.Guard).
type PolicyAdmin struct{}

func init() { caddy.RegisterModule(PolicyAdmin{}) }

// CaddyModule returns the Caddy module information.
func (PolicyAdmin) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{ID: "admin.api.molly_policy", New: func() caddy.Module { return new(PolicyAdmin) }}
}

// Routes returns the admin routes.
func (PolicyAdmin) Routes() []caddy.AdminRoute {
	return []caddy.AdminRoute{{Pattern: "/molly/policy", Handler: admin.Guard(caddy.AdminHandlerFunc(servePolicy))}}
}

func servePolicy(w http.ResponseWriter, r *http.Request) error {
	if r.Method != http.MethodGet {
		return admin.MethodNotAllowed(r, http.MethodGet)
	}
	cur := Current()
	if cur == nil || cur.policy == nil {
		return caddy.APIError{HTTPStatus: http.StatusNotFound, Err: errors.New("no molly app is running")}
	}
	return writeJSON(w, http.StatusOK, cur.policy.Status())
}

// Interface guard.
var _ caddy.AdminRouter = PolicyAdmin{}
