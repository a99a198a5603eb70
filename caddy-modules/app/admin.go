package app

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/caddyserver/caddy/v2"

	"github.com/molly-gateway/molly/caddy-modules/admin"
	"github.com/molly-gateway/molly/registry"
	"github.com/molly-gateway/molly/router/classify"
	"github.com/molly-gateway/molly/router/identity"
	"github.com/molly-gateway/molly/router/openai"
	"github.com/molly-gateway/molly/router/pipeline"
)

// ToolsAdmin is the admin API module admin.api.molly_tools, under Caddy's
// admin endpoint (Molly's default: a Unix socket, mode 0600; see package
// admin): clients call governed tools directly, under the same tool policy
// and audit as the tool loop.
//
//	GET  /molly/tools          every tool: [{"name", "description", "side_effect", "args_schema", "result_schema"}]
//	POST /molly/tools/<name>   {"member": "...", "scopes": ["tool:…", "model:…", "tier:…"],
//	                            "arguments": {...}, "idempotency_key": "..."} → 200 {"result": ...}
//
// A direct call is decided by policies/tools.rego with tier "T0"
// (pipeline.DirectTier: no model asked for it) and the member and scopes of
// the body (scopes as molly_auth gives them: an empty tool scope admits
// every tool); its arguments and result are classified with the default
// detectors. Errors are in OpenAI's shape (admin.Guard): 400 for a bad
// body, 413 for one over 1 MiB, 404 for an unknown tool (or none
// configured), 405 for another method, 403 type policy_denied, code
// permission_denied, with the policy's "reasons" in the error object for
// a policy denial, 502 type upstream_error with the tool's code for a
// failed tool call (unavailable when the plugin is down). Every call writes the tool loop's "tool call" audit
// line (decision_id empty, tool_call_id the idempotency key, target
// "direct").
type ToolsAdmin struct{}

func init() { caddy.RegisterModule(ToolsAdmin{}) }

// CaddyModule returns the Caddy module information.
func (ToolsAdmin) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{ID: "admin.api.molly_tools", New: func() caddy.Module { return new(ToolsAdmin) }}
}

// Routes returns the admin routes.
func (ToolsAdmin) Routes() []caddy.AdminRoute {
	h := func(w http.ResponseWriter, r *http.Request) error {
		cur := Current()
		if cur == nil || cur.pipeline == nil || cur.pipeline.Tools == nil {
			return caddy.APIError{HTTPStatus: http.StatusNotFound, Err: errors.New("no governed tools are configured")}
		}
		return serveTools(w, r, cur.pipeline, cur.toolClassifier)
	}
	return []caddy.AdminRoute{
		{Pattern: "/molly/tools", Handler: admin.Guard(caddy.AdminHandlerFunc(h))},
		{Pattern: "/molly/tools/", Handler: admin.Guard(caddy.AdminHandlerFunc(h))},
	}
}

// toolInfo is one entry of GET /molly/tools.
type toolInfo struct {
	Name         string          `json:"name"`
	Description  string          `json:"description"`
	SideEffect   string          `json:"side_effect"`
	ArgsSchema   json.RawMessage `json:"args_schema"`
	ResultSchema json.RawMessage `json:"result_schema"`
}

// toolCall is the body of POST /molly/tools/<name>.
type toolCall struct {
	Member         string          `json:"member"`
	Scopes         []string        `json:"scopes"`
	Arguments      json.RawMessage `json:"arguments"`
	IdempotencyKey string          `json:"idempotency_key"`
}

// serveTools answers the tools routes on f's tools, classifying with cl.
func serveTools(w http.ResponseWriter, r *http.Request, f *pipeline.Pipeline, cl *classify.Classifier) error {
	name, sub := strings.CutPrefix(r.URL.Path, "/molly/tools/")
	if !sub {
		if r.Method != http.MethodGet {
			return admin.MethodNotAllowed(r, http.MethodGet)
		}
		out := []toolInfo{}
		for _, s := range f.Tools.Tools() {
			out = append(out, toolInfo{Name: s.Name, Description: s.Description, SideEffect: s.SideEffect, ArgsSchema: orNull(s.Parameters), ResultSchema: orNull(s.Result)})
		}
		return writeJSON(w, http.StatusOK, out)
	}
	if r.Method != http.MethodPost {
		return admin.MethodNotAllowed(r, http.MethodPost)
	}
	known := false
	for _, s := range f.Tools.Tools() {
		known = known || s.Name == name
	}
	if !known {
		return caddy.APIError{HTTPStatus: http.StatusNotFound, Err: fmt.Errorf("no tool %q is configured", name)}
	}
	var req toolCall
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<20))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		return caddy.APIError{HTTPStatus: http.StatusBadRequest, Err: fmt.Errorf("decoding body: %w", err)}
	}
	if dec.More() {
		return caddy.APIError{HTTPStatus: http.StatusBadRequest, Err: errors.New("body must be one JSON object")}
	}
	if req.Member == "" {
		return caddy.APIError{HTTPStatus: http.StatusBadRequest, Err: errors.New("member is required")}
	}
	if a := bytes.TrimSpace(req.Arguments); len(a) == 0 || a[0] != '{' {
		return caddy.APIError{HTTPStatus: http.StatusBadRequest, Err: errors.New("arguments must be a JSON object")}
	}
	sc, err := registry.ParseScopes(req.Scopes)
	if err != nil {
		return caddy.APIError{HTTPStatus: http.StatusBadRequest, Err: err}
	}
	id := &identity.Identity{Member: req.Member, Models: sc.Models, Tiers: sc.Tiers, Tools: sc.Tools}
	res, reasons, te := f.CallTool(r.Context(), cl, id, name, req.Arguments, req.IdempotencyKey)
	switch {
	case te == nil:
		return writeJSON(w, http.StatusOK, map[string]json.RawMessage{"result": res})
	case te.Code == "permission_denied":
		if reasons == nil {
			reasons = []string{}
		}
		return &openai.Error{Status: http.StatusForbidden, Type: "policy_denied", Code: te.Code, Message: te.Message, Extra: map[string]any{"reasons": reasons}}
	default:
		return &openai.Error{Status: http.StatusBadGateway, Type: "upstream_error", Code: te.Code, Message: te.Message}
	}
}

func orNull(b json.RawMessage) json.RawMessage {
	if len(b) == 0 || !json.Valid(b) {
		return json.RawMessage("null")
	}
	return b
}

func writeJSON(w http.ResponseWriter, status int, v any) error {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	return json.NewEncoder(w).Encode(v)
}

// Interface guard.
var _ caddy.AdminRouter = ToolsAdmin{}
