package serve

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"

	"github.com/caddyserver/caddy/v2"

	"github.com/molly-gateway/molly/caddy-modules/admin"
	"github.com/molly-gateway/molly/caddy-modules/app"
	"github.com/molly-gateway/molly/serving"
)

// Admin is the admin API module admin.api.molly, under Caddy's admin
// endpoint (Molly's default: a Unix socket, see package admin):
//
//	GET    /molly/adapters          list adapters: content version (sha256), base checksum,
//	                                quantization, state (hot|warm|cold), draining old versions
//	POST   /molly/adapters          {"name": "...", "path": "file.gguf"} (no other field) add an adapter: a file inside the
//	                                engine's adapter directory (absolute, or relative to it); 403 for
//	                                any other path or when no adapter directory is configured;
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
		{Pattern: "/molly/adapters", Handler: admin.Guard(caddy.AdminHandlerFunc(a.adapters))},
		{Pattern: "/molly/adapters/", Handler: admin.Guard(caddy.AdminHandlerFunc(a.adapter))},
		{Pattern: "/molly/engine", Handler: admin.Guard(caddy.AdminHandlerFunc(a.state))},
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
		dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<16))
		dec.DisallowUnknownFields() // as the other admin routes: a misspelt field is an error, not ignored
		if err := dec.Decode(&req); err != nil {
			return caddy.APIError{HTTPStatus: http.StatusBadRequest, Err: fmt.Errorf("decoding body: %w", err)}
		}
		if dec.More() {
			return caddy.APIError{HTTPStatus: http.StatusBadRequest, Err: errors.New("body must be one JSON object")}
		}
		if req.Name == "" || req.Path == "" {
			return caddy.APIError{HTTPStatus: http.StatusBadRequest, Err: errors.New(`body must be {"name": "...", "path": "..."}`)}
		}
		if !adapterName.MatchString(req.Name) || req.Name == "." || req.Name == ".." { // path segments: /molly/adapters/.. cannot address them
			return caddy.APIError{HTTPStatus: http.StatusBadRequest, Err: fmt.Errorf("adapter name %q: use letters, digits, '.', '_' or '-' (at most 64), not '.' or '..'", req.Name)}
		}
		for _, a := range e.Adapters() {
			if a.Name == req.Name {
				return caddy.APIError{HTTPStatus: http.StatusConflict, Err: fmt.Errorf("adapter %q exists (from %s); DELETE it first", req.Name, a.Path)}
			}
		}
		path, err := adapterFile(req.Path)
		if err != nil {
			return err
		}
		if err := e.AddAdapter(req.Name, path); err != nil {
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
	return admin.MethodNotAllowed(r, http.MethodGet, http.MethodPost)
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
	case name == "":
		return caddy.APIError{HTTPStatus: http.StatusNotFound, Err: errors.New("no adapter name: DELETE /molly/adapters/<name>")}
	case name == "rescan":
		return admin.MethodNotAllowed(r, http.MethodPost)
	case r.Method == http.MethodDelete:
		if err := e.RemoveAdapter(name); err != nil {
			return caddy.APIError{HTTPStatus: http.StatusNotFound, Err: err}
		}
		w.WriteHeader(http.StatusNoContent)
		return nil
	}
	return admin.MethodNotAllowed(r, http.MethodDelete)
}

func (Admin) state(w http.ResponseWriter, r *http.Request) error {
	e, err := engine()
	if err != nil {
		return err
	}
	if r.Method != http.MethodGet {
		return admin.MethodNotAllowed(r, http.MethodGet)
	}
	return writeJSON(w, http.StatusOK, map[string]any{"model": e.Name(), "models": e.Models(), "versions": e.ModelVersions(), "stats": e.Stats(), "adapters": e.Adapters()})
}

// adapterFile resolves path — absolute, or relative to the engine's
// adapter directory — to a regular file inside that directory (symbolic
// links resolved). A path outside it is refused before anything is looked
// up, so the route cannot tell which files exist elsewhere; with no
// adapter directory configured, uploads are refused.
func adapterFile(path string) (string, error) {
	cur := app.Current()
	dir := ""
	if cur != nil && cur.EngineConfig != nil {
		dir = cur.EngineConfig.AdapterDir
	}
	outside := caddy.APIError{HTTPStatus: http.StatusForbidden,
		Err: fmt.Errorf("adapters are read only from the engine's adapter directory (engine { adapters <dir> })")}
	if dir == "" {
		return "", outside
	}
	abs, err := filepath.Abs(dir)
	root := abs
	if err == nil {
		root, err = filepath.EvalSymlinks(abs)
	}
	if err != nil {
		return "", caddy.APIError{HTTPStatus: http.StatusInternalServerError, Err: fmt.Errorf("the adapter directory: %w", err)}
	}
	if !filepath.IsAbs(path) {
		path = filepath.Join(root, path)
	}
	if path = filepath.Clean(path); !within(root, path) && !within(abs, path) {
		return "", outside
	}
	real, err := filepath.EvalSymlinks(path)
	if err != nil {
		return "", caddy.APIError{HTTPStatus: http.StatusBadRequest, Err: fmt.Errorf("no adapter file %s in the adapter directory", filepath.Base(path))}
	}
	if !within(root, real) {
		return "", outside
	}
	if st, err := os.Stat(real); err != nil || !st.Mode().IsRegular() {
		return "", caddy.APIError{HTTPStatus: http.StatusBadRequest, Err: fmt.Errorf("%s in the adapter directory is not a regular file", filepath.Base(path))}
	}
	return real, nil
}

// within reports whether path lies strictly inside dir (both clean, absolute).
func within(dir, path string) bool {
	rel, err := filepath.Rel(dir, path)
	return err == nil && rel != "." && rel != ".." && !strings.HasPrefix(rel, ".."+string(filepath.Separator)) && !filepath.IsAbs(rel)
}

var adapterName = regexp.MustCompile(`^[A-Za-z0-9._-]{1,64}$`)

// Interface guard.
var _ caddy.AdminRouter = Admin{}
