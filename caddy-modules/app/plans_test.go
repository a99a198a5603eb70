package app

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"

	"github.com/molly-gateway/molly/caddy-modules/admin"
	"github.com/molly-gateway/molly/router/orchestrate"
)

func TestPlansAdminAnswersFromTheStore(t *testing.T) {
	s := orchestrate.NewStore(4)
	do := func(method, path string) (int, string) {
		w := httptest.NewRecorder()
		if err := servePlans(w, httptest.NewRequest(method, path, nil), s); err != nil {
			e := admin.Error(err) // as admin.Guard answers it
			return e.Status, string(e.Body())
		}
		return w.Code, w.Body.String()
	}
	if code, body := do(http.MethodGet, "/molly/plans"); code != 200 || strings.TrimSpace(body) != "[]" {
		t.Errorf("the empty listing: %d %s", code, body)
	}
	if code, body := do(http.MethodGet, "/molly/plans/0000"); code != 404 ||
		body != `{"error":{"code":"not_found","message":"no plan \"0000\" is kept","param":null,"type":"invalid_request_error"}}` {
		t.Errorf("an unknown plan: %d %s", code, body)
	}
	if code, _ := do(http.MethodDelete, "/molly/plans/0000"); code != 405 {
		t.Errorf("DELETE: %d, want 405", code)
	}
}

func TestTheOrchestratorOption(t *testing.T) {
	parse := func(src string) (*App, error) {
		d := caddyfile.NewTestDispenser(src)
		v, err := parseGlobal(d, nil)
		if err != nil {
			return nil, err
		}
		a := new(App)
		return a, json.Unmarshal(v.(httpcaddyfile.App).Value, a)
	}
	a, err := parse("molly {\n orchestrator {\n controller planner\n controller_tier T1\n auto\n max_parallel 3\n max_refinements 0\n }\n}")
	if err != nil {
		t.Fatal(err)
	}
	c := a.Orchestrator
	if c == nil || c.Controller != "planner" || c.ControllerTier != "T1" || !c.Auto || c.MaxParallel != 3 || c.MaxRefinements == nil || *c.MaxRefinements != 0 {
		t.Errorf("parsed %+v", c)
	}
	if a, err := parse("molly {\n orchestrator off\n}"); err != nil || !a.NoOrchestrator {
		t.Errorf("orchestrator off: %v %+v", err, a)
	}
	for _, bad := range []string{"molly {\n orchestrator {\n controller_tier T7\n }\n}", "molly {\n orchestrator {\n max_parallel 0\n }\n}",
		"molly {\n orchestrator on\n}", "molly {\n orchestrator {\n agents 3\n }\n}"} {
		if _, err := parse(bad); err == nil {
			t.Errorf("%q was accepted", bad)
		}
	}
}
