package app

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/molly-gateway/molly/caddy-modules/admin"
	"github.com/molly-gateway/molly/learning/adapters"
	"github.com/molly-gateway/molly/learning/curate"
	"github.com/molly-gateway/molly/learning/specialise"
	"github.com/molly-gateway/molly/learning/traces"
	"github.com/molly-gateway/molly/registry"
)

// LearningAdmin is the admin API module admin.api.molly_learning, under
// Caddy's admin endpoint (Molly's default: a Unix socket, mode 0600): the
// specialisation loop's traces, curated sets and adapter versions.
//
//	POST   /molly/specialise/run               run one cycle now → the cycle's report
//	                                           (409 while one runs)
//	GET    /molly/specialise/share             requests answered per task category and tier,
//	                                           per hour for the last week: [{"start", "category",
//	                                           "requests", "tiers": {"T0": n, ...}, "share": {"T0": 0.4, ...}}]
//	GET    /molly/traces?member=&category=&limit=
//	                                           traces without their text: [{"id", "decision_id",
//	                                           "member", "category", "tier", "target", "served_model",
//	                                           "label", "feedback", "created"}]
//	DELETE /molly/traces?member=<m>            forget a member: their traces, curated items,
//	                                           and the count on adapters trained on them
//	POST   /molly/traces/consent               {"scope": "member"|"key", "name", "trace": bool,
//	                                           "retention_days"} a standing consent
//	GET    /molly/traces/export?set=<s>[&split=train|held_out]
//	GET    /molly/traces/export?domain=<d>[&split=…]
//	                                           OpenAI fine-tuning JSONL of a stored curated set,
//	                                           or of a set curated now from the domain's traces
//	POST   /molly/traces/import?set=<s>&domain=<d>
//	                                           JSONL body → a curated set (split by prompt hash)
//	GET    /molly/adapter-versions             every adapter name: serving version, versions
//	                                           with scores, history
//	POST   /molly/adapter-versions             {"name", "path"} import an adapter GGUF (an external
//	                                           trainer's) as a version of name: a file inside the
//	                                           engine's adapter directory (403 otherwise), pinned to
//	                                           the base (409 for another base's); not promoted
//	POST   /molly/adapter-versions/promote     {"name", "version" (a hash prefix), "reason"}
//	POST   /molly/adapter-versions/rollback    {"name", "reason"}
//
// Without a specialise block every route answers 404. Errors are in
// OpenAI's shape (admin.Guard): 400 for a bad body or query, 413 for a body
// over the route's limit, 404 for an unknown set or version, 405 (with
// Allow) for a route's other methods, 409 for a version of another base or
// no earlier version to roll back to.
type LearningAdmin struct{}

func init() { caddy.RegisterModule(LearningAdmin{}) }

// CaddyModule returns the Caddy module information.
func (LearningAdmin) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{ID: "admin.api.molly_learning", New: func() caddy.Module { return new(LearningAdmin) }}
}

// Routes returns the admin routes.
func (LearningAdmin) Routes() []caddy.AdminRoute {
	h := func(w http.ResponseWriter, r *http.Request) error {
		cur := Current()
		if cur == nil || cur.loop == nil {
			return caddy.APIError{HTTPStatus: http.StatusNotFound, Err: errors.New("the specialisation loop is not configured (molly { specialise { ... } })")}
		}
		return cur.serveLearning(w, r)
	}
	var out []caddy.AdminRoute
	for _, p := range []string{"/molly/specialise/", "/molly/traces", "/molly/traces/", "/molly/adapter-versions", "/molly/adapter-versions/"} {
		out = append(out, caddy.AdminRoute{Pattern: p, Handler: admin.Guard(caddy.AdminHandlerFunc(h))})
	}
	return out
}

// TraceInfo is one trace as GET /molly/traces lists it: no text.
type TraceInfo struct {
	ID          int64     `json:"id"`
	DecisionID  string    `json:"decision_id"`
	Member      string    `json:"member"`
	Category    string    `json:"category"`
	Tier        string    `json:"tier"`
	Target      string    `json:"target"`
	ServedModel string    `json:"served_model"`
	Label       string    `json:"label"`
	Feedback    float64   `json:"feedback"`
	Edited      bool      `json:"edited"`
	Created     time.Time `json:"created"`
}

func apiErr(status int, format string, args ...any) error {
	return caddy.APIError{HTTPStatus: status, Err: fmt.Errorf(format, args...)}
}

func decodeBody(w http.ResponseWriter, r *http.Request, v any) error {
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<16))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return apiErr(http.StatusBadRequest, "decoding body: %w", err)
	}
	return nil
}

func (a *App) serveLearning(w http.ResponseWriter, r *http.Request) error {
	ctx := r.Context()
	q := r.URL.Query()
	route := r.Method + " " + r.URL.Path
	switch route {
	case "POST /molly/specialise/run":
		rep, err := a.loop.RunOnce(ctx)
		if errors.Is(err, specialise.ErrBusy) {
			return apiErr(http.StatusConflict, "%v", err)
		}
		if err != nil {
			return apiErr(http.StatusInternalServerError, "%v", err)
		}
		return writeJSON(w, http.StatusOK, rep)
	case "GET /molly/specialise/share":
		rows := a.share.Rows()
		if rows == nil {
			rows = []traces.ShareRow{}
		}
		return writeJSON(w, http.StatusOK, rows)
	case "GET /molly/traces":
		limit := 0
		if s := q.Get("limit"); s != "" {
			n, err := strconv.Atoi(s)
			if err != nil || n < 0 {
				return apiErr(http.StatusBadRequest, "limit %q: want a non-negative integer", s)
			}
			limit = n
		}
		ts, err := a.registry.Traces(ctx, registry.TraceQuery{Member: q.Get("member"), Category: q.Get("category"), Limit: limit})
		if err != nil {
			return apiErr(http.StatusInternalServerError, "%v", err)
		}
		out := make([]TraceInfo, 0, len(ts))
		for _, t := range ts {
			out = append(out, TraceInfo{ID: t.ID, DecisionID: t.DecisionID, Member: t.Member, Category: t.Category, Tier: t.Tier,
				Target: t.Target, ServedModel: t.ServedModel, Label: t.Label, Feedback: t.Feedback, Edited: t.Edit != "", Created: t.Created})
		}
		return writeJSON(w, http.StatusOK, out)
	case "DELETE /molly/traces":
		member := q.Get("member")
		if member == "" {
			return apiErr(http.StatusBadRequest, "member is required: DELETE /molly/traces?member=<name>")
		}
		// What is still queued of the member is stored first, then forgotten with the rest.
		if err := a.recorder.Flush(ctx); err != nil {
			return apiErr(http.StatusInternalServerError, "%v", err)
		}
		gone, err := a.registry.DeleteMemberTraces(ctx, member)
		if err != nil {
			return apiErr(http.StatusInternalServerError, "%v", err)
		}
		return writeJSON(w, http.StatusOK, gone)
	case "POST /molly/traces/consent":
		var c struct {
			Scope         string `json:"scope"`
			Name          string `json:"name"`
			Trace         bool   `json:"trace"`
			RetentionDays int    `json:"retention_days"`
		}
		if err := decodeBody(w, r, &c); err != nil {
			return err
		}
		err := a.recorder.SetConsent(ctx, registry.TraceConsent{Scope: c.Scope, Name: c.Name, Trace: c.Trace, RetentionDays: c.RetentionDays})
		if errors.Is(err, registry.ErrInvalid) {
			return apiErr(http.StatusBadRequest, "%v", err)
		} else if err != nil {
			return apiErr(http.StatusInternalServerError, "%v", err)
		}
		if c.Scope == registry.ConsentKey {
			c.Name = registry.DisplayPrefix(c.Name) // as stored: a whole key is kept as its prefix
		}
		return writeJSON(w, http.StatusOK, c)
	case "GET /molly/traces/export":
		return a.exportSet(w, r)
	case "POST /molly/traces/import":
		name, domain := q.Get("set"), q.Get("domain")
		if name == "" || domain == "" {
			return apiErr(http.StatusBadRequest, "set and domain are required: POST /molly/traces/import?set=<name>&domain=<category>")
		}
		set, rep, err := curate.Import(name, domain, http.MaxBytesReader(w, r.Body, 64<<20), curate.Options{})
		if err != nil {
			return apiErr(http.StatusBadRequest, "%w", err)
		}
		if err := a.registry.PutCuratedSet(ctx, set); err != nil {
			return apiErr(http.StatusInternalServerError, "%v", err)
		}
		return writeJSON(w, http.StatusOK, rep)
	case "GET /molly/adapter-versions":
		list, err := a.loop.Store().List(ctx)
		if err != nil {
			return apiErr(http.StatusInternalServerError, "%v", err)
		}
		if list == nil {
			list = []adapters.Entry{}
		}
		return writeJSON(w, http.StatusOK, list)
	case "POST /molly/adapter-versions":
		var body struct {
			Name string `json:"name"`
			Path string `json:"path"`
		}
		if err := decodeBody(w, r, &body); err != nil {
			return err
		}
		if body.Name == "" || body.Path == "" || strings.ContainsAny(body.Name, ":/@ ") {
			return apiErr(http.StatusBadRequest, `body must be {"name": "<adapter name without ':', '/', '@' or spaces>", "path": "<file>"}`)
		}
		path, err := a.inAdapterDir(body.Path)
		if err != nil {
			return err
		}
		v, err := a.loop.Store().Add(ctx, body.Name, path, "import", "", nil)
		switch {
		case errors.Is(err, adapters.ErrOtherBase):
			return apiErr(http.StatusConflict, "%v", err)
		case err != nil && strings.Contains(err.Error(), "adapter"):
			return apiErr(http.StatusUnprocessableEntity, "%v", err)
		case err != nil:
			return apiErr(http.StatusInternalServerError, "%v", err)
		}
		return writeJSON(w, http.StatusCreated, v)
	case "POST /molly/adapter-versions/promote", "POST /molly/adapter-versions/rollback":
		var body struct {
			Name    string `json:"name"`
			Version string `json:"version"`
			Reason  string `json:"reason"`
		}
		if err := decodeBody(w, r, &body); err != nil {
			return err
		}
		if body.Name == "" {
			return apiErr(http.StatusBadRequest, "name is required")
		}
		var v registry.AdapterVersion
		var err error
		if strings.HasSuffix(r.URL.Path, "/promote") {
			if body.Version == "" {
				return apiErr(http.StatusBadRequest, "version is required (a prefix of its hash)")
			}
			if body.Reason == "" {
				body.Reason = "by an administrator"
			}
			v, err = a.loop.Store().Promote(ctx, a.loop.Promotion(), body.Name, body.Version, "promote", body.Reason)
		} else {
			if body.Reason == "" {
				body.Reason = "by an administrator"
			}
			v, err = a.loop.Store().Rollback(ctx, a.loop.Promotion(), body.Name, body.Reason)
		}
		switch {
		case errors.Is(err, registry.ErrNotFound):
			return apiErr(http.StatusNotFound, "%v", err)
		case errors.Is(err, adapters.ErrOtherBase), errors.Is(err, adapters.ErrNoPrevious):
			return apiErr(http.StatusConflict, "%v", err)
		case err != nil && strings.Contains(err.Error(), "is of adapter"):
			return apiErr(http.StatusBadRequest, "%v", err)
		case err != nil:
			return apiErr(http.StatusInternalServerError, "%v", err)
		}
		return writeJSON(w, http.StatusOK, map[string]string{"name": body.Name, "version": v.Version,
			"model": a.engine.Name() + ":" + body.Name, "pinned": a.engine.Name() + ":" + adapters.Pinned(body.Name, v.Version)})
	}
	return admin.NotRouted(r, learningRoutes)
}

// learningRoutes are the methods of each learning route.
var learningRoutes = map[string][]string{
	"/molly/specialise/run":            {http.MethodPost},
	"/molly/specialise/share":          {http.MethodGet},
	"/molly/traces":                    {http.MethodGet, http.MethodDelete},
	"/molly/traces/consent":            {http.MethodPost},
	"/molly/traces/export":             {http.MethodGet},
	"/molly/traces/import":             {http.MethodPost},
	"/molly/adapter-versions":          {http.MethodGet, http.MethodPost},
	"/molly/adapter-versions/promote":  {http.MethodPost},
	"/molly/adapter-versions/rollback": {http.MethodPost},
}

// inAdapterDir resolves path — absolute, or relative to the engine's
// adapter directory — to a regular file inside that directory, symbolic
// links resolved; any other path is refused with 403 before it is looked
// at, so the route cannot probe files elsewhere.
func (a *App) inAdapterDir(path string) (string, error) {
	outside := apiErr(http.StatusForbidden, "adapter files are read only from the engine's adapter directory (engine { adapters <dir> })")
	dir := ""
	if a.EngineConfig != nil {
		dir = a.EngineConfig.AdapterDir
	}
	if dir == "" {
		return "", outside
	}
	root, err := filepath.Abs(dir)
	if err == nil {
		root, err = filepath.EvalSymlinks(root)
	}
	if err != nil {
		return "", apiErr(http.StatusInternalServerError, "the adapter directory: %v", err)
	}
	if !filepath.IsAbs(path) {
		path = filepath.Join(root, path)
	}
	inside := func(p string) bool {
		rel, err := filepath.Rel(root, p)
		return err == nil && rel != "." && rel != ".." && !strings.HasPrefix(rel, ".."+string(filepath.Separator))
	}
	if !inside(filepath.Clean(path)) {
		return "", outside
	}
	real, err := filepath.EvalSymlinks(path)
	if err != nil {
		return "", apiErr(http.StatusBadRequest, "no adapter file %s in the adapter directory", filepath.Base(path))
	}
	if !inside(real) {
		return "", outside
	}
	if st, err := os.Stat(real); err != nil || !st.Mode().IsRegular() {
		return "", apiErr(http.StatusBadRequest, "%s in the adapter directory is not a regular file", filepath.Base(path))
	}
	return real, nil
}

// exportSet writes a curated set (stored, or curated now from a domain's
// traces) as OpenAI fine-tuning JSONL.
func (a *App) exportSet(w http.ResponseWriter, r *http.Request) error {
	ctx := r.Context()
	q := r.URL.Query()
	split := q.Get("split")
	if split != "" && split != registry.SplitTrain && split != registry.SplitHeldOut {
		return apiErr(http.StatusBadRequest, "split %q: want %s or %s", split, registry.SplitTrain, registry.SplitHeldOut)
	}
	var set registry.CuratedSet
	switch name, domain := q.Get("set"), q.Get("domain"); {
	case name != "" && domain == "":
		s, err := a.registry.CuratedSet(ctx, name)
		if errors.Is(err, registry.ErrNotFound) {
			return apiErr(http.StatusNotFound, "no curated set %q", name)
		} else if err != nil {
			return apiErr(http.StatusInternalServerError, "%v", err)
		}
		set = s
	case domain != "" && name == "":
		if err := a.recorder.Flush(ctx); err != nil {
			return apiErr(http.StatusInternalServerError, "%v", err)
		}
		ts, err := a.registry.Traces(ctx, registry.TraceQuery{Category: domain})
		if err != nil {
			return apiErr(http.StatusInternalServerError, "%v", err)
		}
		set, _ = curate.Curate("export-"+domain, domain, ts, curate.Options{HeldOut: a.Specialise.HeldOut})
	default:
		return apiErr(http.StatusBadRequest, "name one of set=<curated set> or domain=<category>")
	}
	w.Header().Set("Content-Type", "application/jsonl")
	w.WriteHeader(http.StatusOK)
	_, err := curate.WriteJSONL(w, set, split)
	return err
}

// Interface guard.
var _ caddy.AdminRouter = LearningAdmin{}
