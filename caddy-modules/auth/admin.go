package auth

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/molly-gateway/molly/caddy-modules/admin"
	"github.com/molly-gateway/molly/registry"
)

// Admin is the admin API module admin.api.molly_keys, under Caddy's admin
// endpoint (Molly's default: a Unix socket, mode 0600; see package admin).
// It manages the registry of the running molly_auth handler:
//
//	GET    /molly/members             every member (JSON array of registry.Member)
//	POST   /molly/members             create or update one: {"name", "budget_usd", "period": "day"|"month",
//	                                  "period_start" (RFC 3339), "rpm", "tpm", "models", "tiers", "tools"};
//	                                  201 when created, 200 when updated
//	POST   /molly/keys                {"member", "name"} → 201 {"key": "sk-molly-…", "prefix", "member", "name", "created"};
//	                                  the only time the key is shown
//	GET    /molly/keys[?member=]      keys by prefix (never the key), revoked ones with "revoked"
//	DELETE /molly/keys/<prefix>       revoke (a whole key is cut to its prefix); 204, 404 for an unknown prefix
//	GET    /molly/usage?member=<m>    usage in the current budget period (registry.Summary); without
//	                                  member, an array with every member's
//
// Errors are in OpenAI's shape, {"error":{"message","type","param","code"}}
// (admin.Guard): 400 for a bad body, 413 for one over 64 KiB, 404 for an
// unknown member or key, 405 (with Allow) for another method, 404 when no
// molly_auth handler runs (a feature not configured, as the engine,
// specialise and federation routes answer; 503 is only for transient
// capacity).
type Admin struct{}

func init() { caddy.RegisterModule(Admin{}) }

// CaddyModule returns the Caddy module information.
func (Admin) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{ID: "admin.api.molly_keys", New: func() caddy.Module { return new(Admin) }}
}

// Routes returns the admin routes.
func (a Admin) Routes() []caddy.AdminRoute {
	return []caddy.AdminRoute{
		{Pattern: "/molly/members", Handler: admin.Guard(caddy.AdminHandlerFunc(a.members))},
		{Pattern: "/molly/keys", Handler: admin.Guard(caddy.AdminHandlerFunc(a.keys))},
		{Pattern: "/molly/keys/", Handler: admin.Guard(caddy.AdminHandlerFunc(a.key))},
		{Pattern: "/molly/usage", Handler: admin.Guard(caddy.AdminHandlerFunc(a.usage))},
	}
}

// recentUsage is how many ledger entries GET /molly/usage lists per member.
const recentUsage = 50

func reg() (*registry.Registry, error) {
	r := active.Load()
	if r == nil {
		return nil, caddy.APIError{HTTPStatus: http.StatusNotFound, Err: errors.New("no molly_auth handler is running, so there is no key registry")}
	}
	return r, nil
}

func writeJSON(w http.ResponseWriter, status int, v any) error {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	return json.NewEncoder(w).Encode(v)
}

// apiErr maps registry errors to admin API statuses.
func apiErr(err error) error {
	status := http.StatusInternalServerError
	switch {
	case errors.Is(err, registry.ErrNotFound):
		status = http.StatusNotFound
	case errors.Is(err, registry.ErrInvalid):
		status = http.StatusBadRequest
	}
	return caddy.APIError{HTTPStatus: status, Err: err}
}

func decode(w http.ResponseWriter, r *http.Request, v any) error {
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<16))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return caddy.APIError{HTTPStatus: http.StatusBadRequest, Err: fmt.Errorf("decoding body: %w", err)}
	}
	return nil
}

func notAllowed(r *http.Request, allow ...string) error { return admin.MethodNotAllowed(r, allow...) }

func (Admin) members(w http.ResponseWriter, r *http.Request) error {
	rg, err := reg()
	if err != nil {
		return err
	}
	switch r.Method {
	case http.MethodGet:
		ms, err := rg.Members(r.Context())
		if err != nil {
			return apiErr(err)
		}
		return writeJSON(w, http.StatusOK, ms)
	case http.MethodPost:
		var m registry.Member
		if err := decode(w, r, &m); err != nil {
			return err
		}
		m.Created = time.Time{}
		stored, created, err := rg.PutMember(r.Context(), m)
		if err != nil {
			return apiErr(err)
		}
		status := http.StatusOK
		if created {
			status = http.StatusCreated
		}
		return writeJSON(w, status, stored)
	}
	return notAllowed(r, http.MethodGet, http.MethodPost)
}

func (Admin) keys(w http.ResponseWriter, r *http.Request) error {
	rg, err := reg()
	if err != nil {
		return err
	}
	switch r.Method {
	case http.MethodGet:
		ks, err := rg.Keys(r.Context(), r.URL.Query().Get("member"))
		if err != nil {
			return apiErr(err)
		}
		return writeJSON(w, http.StatusOK, ks)
	case http.MethodPost:
		var req struct {
			Member string `json:"member"`
			Name   string `json:"name"`
		}
		if err := decode(w, r, &req); err != nil {
			return err
		}
		if req.Member == "" {
			return caddy.APIError{HTTPStatus: http.StatusBadRequest, Err: errors.New(`body must be {"member": "...", "name": "..."}`)}
		}
		secret, k, err := rg.CreateKey(r.Context(), req.Member, req.Name)
		if err != nil {
			return apiErr(err)
		}
		return writeJSON(w, http.StatusCreated, struct {
			Secret string `json:"key"`
			registry.Key
		}{secret, k})
	}
	return notAllowed(r, http.MethodGet, http.MethodPost)
}

func (Admin) key(w http.ResponseWriter, r *http.Request) error {
	rg, err := reg()
	if err != nil {
		return err
	}
	prefix := strings.TrimPrefix(r.URL.Path, "/molly/keys/")
	if prefix == "" {
		return caddy.APIError{HTTPStatus: http.StatusNotFound, Err: errors.New("no key prefix: DELETE /molly/keys/<prefix>")}
	}
	if r.Method != http.MethodDelete {
		return notAllowed(r, http.MethodDelete)
	}
	if err := rg.RevokeKey(r.Context(), prefix); err != nil {
		return apiErr(err)
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (Admin) usage(w http.ResponseWriter, r *http.Request) error {
	rg, err := reg()
	if err != nil {
		return err
	}
	if r.Method != http.MethodGet {
		return notAllowed(r, http.MethodGet)
	}
	if member := r.URL.Query().Get("member"); member != "" {
		s, err := rg.Summarize(r.Context(), member, recentUsage)
		if err != nil {
			return apiErr(err)
		}
		return writeJSON(w, http.StatusOK, s)
	}
	ms, err := rg.Members(r.Context())
	if err != nil {
		return apiErr(err)
	}
	out := []registry.Summary{}
	for _, m := range ms {
		s, err := rg.Summarize(r.Context(), m.Name, recentUsage)
		if err != nil {
			return apiErr(err)
		}
		out = append(out, s)
	}
	return writeJSON(w, http.StatusOK, out)
}

// Interface guard.
var _ caddy.AdminRouter = Admin{}
