package serve

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"regexp"
	"strings"

	"github.com/caddyserver/caddy/v2"

	"github.com/molly-gateway/molly/caddy-modules/app"
	"github.com/molly-gateway/molly/serving"
)

// Admin is the admin API module admin.api.molly, under Caddy's admin
// endpoint (default localhost:2019):
//
//	GET    /molly/adapters          list adapters: content version (sha256), base checksum,
//	                                quantization, state (hot|warm|cold), draining old versions
//	POST   /molly/adapters          {"name": "...", "path": "/abs/file.gguf"} add an adapter;
//	                                answers {"model", "version"}
//	DELETE /molly/adapters/<name>   remove an adapter until it is added again (the folder
//	                                watch does not bring it back; serving/README.md)
//	POST   /molly/adapters/rescan   rescan the engine's adapter directory now
//	GET    /molly/engine            scheduler state, memory budget use, model versions
type Admin struct{}

func init() { caddy.RegisterModule(Admin{}) }

// CaddyModule returns the Caddy module information.
func (Admin) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{ID: "admin.api.molly", New: func() caddy.Module { return new(Admin) }}
}

// Routes returns the admin routes.
func (a Admin) Routes() []caddy.AdminRoute {
	return []caddy.AdminRoute{
		{Pattern: "/molly/adapters", Handler: caddy.AdminHandlerFunc(a.adapters)},
		{Pattern: "/molly/adapters/", Handler: caddy.AdminHandlerFunc(a.adapter)},
		{Pattern: "/molly/engine", Handler: caddy.AdminHandlerFunc(a.state)},
	}
}

func engine() (*serving.Engine, error) {
	cur := app.Current()
	if cur == nil || cur.Engine() == nil {
		return nil, caddy.APIError{HTTPStatus: http.StatusNotFound, Err: errors.New("no molly engine is running")}
	}
	return cur.Engine(), nil
}

func writeJSON(w http.ResponseWriter, status int, v any) error {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	return json.NewEncoder(w).Encode(v)
}

func (Admin) adapters(w http.ResponseWriter, r *http.Request) error {
	e, err := engine()
	if err != nil {
		return err
	}
	switch r.Method {
	case http.MethodGet:
		return writeJSON(w, http.StatusOK, e.Adapters())
	case http.MethodPost:
		var req struct {
			Name string `json:"name"`
			Path string `json:"path"`
		}
		if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<16)).Decode(&req); err != nil {
			return caddy.APIError{HTTPStatus: http.StatusBadRequest, Err: fmt.Errorf("decoding body: %w", err)}
		}
		if req.Name == "" || req.Path == "" {
			return caddy.APIError{HTTPStatus: http.StatusBadRequest, Err: errors.New(`body must be {"name": "...", "path": "..."}`)}
		}
		if !adapterName.MatchString(req.Name) {
			return caddy.APIError{HTTPStatus: http.StatusBadRequest, Err: fmt.Errorf("adapter name %q: use letters, digits, '.', '_' or '-' (at most 64)", req.Name)}
		}
		for _, a := range e.Adapters() {
			if a.Name == req.Name {
				return caddy.APIError{HTTPStatus: http.StatusConflict, Err: fmt.Errorf("adapter %q exists (from %s); DELETE it first", req.Name, a.Path)}
			}
		}
		if st, err := os.Stat(req.Path); err != nil || st.IsDir() {
			return caddy.APIError{HTTPStatus: http.StatusBadRequest, Err: fmt.Errorf("path %q is not a readable file", req.Path)}
		}
		if err := e.AddAdapter(req.Name, req.Path); err != nil {
			status := http.StatusInternalServerError
			if errors.Is(err, serving.ErrAdapterRefused) {
				status = http.StatusUnprocessableEntity
			}
			return caddy.APIError{HTTPStatus: status, Err: err}
		}
		version := ""
		for _, a := range e.Adapters() {
			if a.Name == req.Name {
				version = a.Version
			}
		}
		return writeJSON(w, http.StatusCreated, map[string]any{"model": e.Name() + ":" + req.Name, "version": version})
	}
	return caddy.APIError{HTTPStatus: http.StatusMethodNotAllowed, Err: fmt.Errorf("method %s not allowed", r.Method)}
}

func (Admin) adapter(w http.ResponseWriter, r *http.Request) error {
	e, err := engine()
	if err != nil {
		return err
	}
	name := strings.TrimPrefix(r.URL.Path, "/molly/adapters/")
	switch {
	case name == "rescan" && r.Method == http.MethodPost:
		if err := e.Rescan(); err != nil {
			return caddy.APIError{HTTPStatus: http.StatusInternalServerError, Err: err}
		}
		return writeJSON(w, http.StatusOK, e.Adapters())
	case r.Method == http.MethodDelete && name != "":
		if err := e.RemoveAdapter(name); err != nil {
			return caddy.APIError{HTTPStatus: http.StatusNotFound, Err: err}
		}
		w.WriteHeader(http.StatusNoContent)
		return nil
	}
	return caddy.APIError{HTTPStatus: http.StatusMethodNotAllowed, Err: fmt.Errorf("%s %s not supported", r.Method, r.URL.Path)}
}

func (Admin) state(w http.ResponseWriter, r *http.Request) error {
	e, err := engine()
	if err != nil {
		return err
	}
	if r.Method != http.MethodGet {
		return caddy.APIError{HTTPStatus: http.StatusMethodNotAllowed, Err: fmt.Errorf("method %s not allowed", r.Method)}
	}
	return writeJSON(w, http.StatusOK, map[string]any{"model": e.Name(), "models": e.Models(), "versions": e.ModelVersions(), "stats": e.Stats(), "adapters": e.Adapters()})
}

var adapterName = regexp.MustCompile(`^[A-Za-z0-9._-]{1,64}$`)

// Interface guard.
var _ caddy.AdminRouter = Admin{}
