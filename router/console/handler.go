package console

import (
	_ "embed"
	"encoding/json"
	"net/http"
	"strings"

	"github.com/molly-gateway/molly/router/openai"
)

//go:embed page.html
var page []byte

// StateDecisions is how many recent decisions the state lists.
const StateDecisions = 50

// Handler serves the console: GET …/console (or …/console/, or the root
// of a stripped prefix) is the page, GET …/state the State as JSON; any
// other path is a 404 not_found in OpenAI's error JSON (an unknown page
// is not the console). Other methods are 405
// method_not_supported in OpenAI's error JSON, with Allow: GET, HEAD. Access control is the caller's (the
// admin endpoint's, or molly_console's key check).
type Handler struct {
	Recorder *Recorder
	Sources  Sources
}

// ServeHTTP implements http.Handler.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		// OpenAI's error JSON with Allow, as every other Molly route answers
		// (the site's molly_console passes other methods here).
		openai.MethodNotAllowed(r.Method, r.URL.Path, "GET, HEAD").Write(w)
		return
	}
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	if isState(r.URL.Path) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(h.Recorder.State(h.Sources, StateDecisions))
		return
	}
	if !isPage(r.URL.Path) {
		(&openai.Error{Status: http.StatusNotFound, Type: "invalid_request_error", Code: "not_found",
			Message: "No console page at " + r.URL.Path + "; the console is at …/console and its state at …/console/state."}).Write(w)
		return
	}
	// Everything the page needs is inline; nothing may load from elsewhere.
	w.Header().Set("Content-Security-Policy", "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; connect-src 'self'; img-src data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	_, _ = w.Write(page)
}

// isPage reports whether path is the console's page: its last element is
// "console", or it is the root (a handle_path that stripped the prefix).
func isPage(path string) bool {
	p := strings.TrimRight(path, "/")
	return p == "" || p == "console" || strings.HasSuffix(p, "/console")
}

// isState reports whether path asks for the state (its last element is
// "state") rather than the page.
func isState(path string) bool {
	return strings.HasSuffix(strings.TrimSuffix(path, "/"), "/state")
}
