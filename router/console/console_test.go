package console

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/molly-gateway/molly/router/observe"
	"github.com/molly-gateway/molly/router/pipeline"
	"github.com/molly-gateway/molly/router/route"
)

var (
	device   = &route.Target{Name: "device", Tier: "T0"}
	external = &route.Target{Name: "external", Tier: "T3"}
)

// answered is an outcome answered by target t after the failed attempts
// of failing, costing usd.
func answered(member, task string, t *route.Target, usd float64, failing ...*route.Target) pipeline.Outcome {
	o := pipeline.Outcome{DecisionID: member + "-" + task + "-" + t.Name, Member: member, Task: task, Model: "chat", Label: "routed", Status: 200,
		Plan: route.Plan{Strategy: route.StrategySingle}}
	for _, f := range failing {
		o.Attempts = append(o.Attempts, pipeline.Attempt{Target: f.Name, Tier: f.Tier, Failure: "connect"})
		o.Plan.Candidates = append(o.Plan.Candidates, route.Candidate{Target: f, Model: "m", Score: 0.9})
		o.Label = "fallback"
	}
	o.Plan.Candidates = append(o.Plan.Candidates, route.Candidate{Target: t, Model: "m", Score: 0.5})
	o.Attempts = append(o.Attempts, pipeline.Attempt{Target: t.Name, Tier: t.Tier, Model: "m", Status: 200, CostUSD: usd, Delivered: true})
	o.Answered = len(o.Attempts) - 1
	return o
}

// TestRecorderKeepsWhatThePageShows: tier mix, spend per member, recent
// decisions newest first (the oldest dropped past the limit), target
// health from recent attempts and the T0 share per category per bucket,
// all counted by hand from the outcomes fed in.
func TestRecorderKeepsWhatThePageShows(t *testing.T) {
	clock := time.Date(2026, 1, 2, 10, 0, 30, 0, time.UTC)
	r := NewRecorder(3, time.Minute, 60)
	r.Now = func() time.Time { return clock }
	r.Record(answered("ann", "billing", device, 0))
	r.Record(answered("ann", "billing", external, 0.25, device))
	clock = clock.Add(time.Minute)
	r.Record(answered("bob", "billing", device, 0))
	r.Record(answered("bob", "chat", external, 0.5))
	r.Record(pipeline.Outcome{DecisionID: "listing", Endpoint: "models", Label: "routed", Answered: -1}) // not a row
	r.Record(pipeline.Outcome{DecisionID: "denied-1", Member: "eve", Label: "denied", Status: 403, Code: "model_not_allowed",
		Reasons: []string{"member eve may not use the model chat"}, Answered: -1})

	s := r.State(Sources{Catalogue: mustCatalogue(t)}, 10)
	if s.Requests != 5 || s.Tiers["T0"] != 2 || s.Tiers["T3"] != 2 || s.Tiers[NoTier] != 1 {
		t.Fatalf("requests %d tiers %v", s.Requests, s.Tiers)
	}
	if len(s.Members) != 3 || s.Members[0].Member != "bob" || s.Members[0].CostUSD != 0.5 || s.Members[1].Member != "ann" ||
		s.Members[1].CostUSD != 0.25 || s.Members[1].Requests != 2 || s.Members[1].Tiers["T0"] != 1 {
		t.Fatalf("members %+v", s.Members)
	}
	if len(s.Decisions) != 3 || s.Decisions[0].ID != "denied-1" || s.Decisions[2].ID != "bob-billing-device" {
		t.Fatalf("decisions %v", ids(s.Decisions))
	}
	if d := s.Decisions[0]; d.Label != "denied" || d.Code != "model_not_allowed" || len(d.Reasons) != 1 || d.Tier != "" {
		t.Fatalf("denied row %+v", d)
	}
	// device: ok, failed (connect), ok → degraded; external: ok, ok → up.
	health := map[string]Target{}
	for _, tv := range s.Targets {
		health[tv.Name] = tv
	}
	if h := health["device"]; h.Health != "degraded" || h.OK != 2 || h.Failed != 1 || h.LastFailure != "connect" {
		t.Fatalf("device %+v", h)
	}
	if h := health["external"]; h.Health != "up" || h.OK != 2 {
		t.Fatalf("external %+v", h)
	}
	if h := health["lan"]; h.Health != "unknown" || len(h.Models) != 1 {
		t.Fatalf("lan %+v", h)
	}
	// billing: minute 0 → 1 of 2 on T0, minute 1 → 1 of 1; chat: minute 1 → 0 of 1.
	want := map[string][]Point{
		"billing": {{T: time.Date(2026, 1, 2, 10, 0, 0, 0, time.UTC), T0: 1, Total: 2}, {T: time.Date(2026, 1, 2, 10, 1, 0, 0, time.UTC), T0: 1, Total: 1}},
		"chat":    {{T: time.Date(2026, 1, 2, 10, 1, 0, 0, time.UTC), T0: 0, Total: 1}},
	}
	if len(s.T0Share.Categories) != 2 || s.T0Share.BucketS != 60 {
		t.Fatalf("series %+v", s.T0Share)
	}
	for _, c := range s.T0Share.Categories {
		w := want[c.Category]
		if len(c.Points) != len(w) {
			t.Fatalf("%s: %+v", c.Category, c.Points)
		}
		for i := range w {
			if !c.Points[i].T.Equal(w[i].T) || c.Points[i].T0 != w[i].T0 || c.Points[i].Total != w[i].Total {
				t.Fatalf("%s point %d: %+v, want %+v", c.Category, i, c.Points[i], w[i])
			}
		}
	}
}

func ids(ds []Decision) []string {
	var out []string
	for _, d := range ds {
		out = append(out, d.ID)
	}
	return out
}

func mustCatalogue(t *testing.T) *route.Catalogue {
	t.Helper()
	c, err := route.NewCatalogue([]*route.Target{
		{Name: "device", Tier: "T1", Endpoint: "http://127.0.0.1:1/v1", Models: []string{"chat"}},
		{Name: "lan", Tier: "T1", Endpoint: "http://127.0.0.1:2/v1", Models: []string{"chat"}},
		{Name: "external", Tier: "T3", Endpoint: "http://127.0.0.1:3/v1", Models: []string{"chat"}},
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestDecisionRowExplainsTheRoute: a row carries the route explanation of
// the answer (X-Molly-Route's format), the redaction counts of the types
// redacted and the attempts in order.
func TestDecisionRowExplainsTheRoute(t *testing.T) {
	o := answered("ann", "chat", external, 0.1, device)
	o.Plan.Excluded = []route.Exclusion{{Target: "lan", Reason: "tier T1 not allowed"}}
	o.Findings, o.RedactedTypes, o.Redacted = map[string]int{"EMAIL": 2, "PHONE": 1}, []string{"EMAIL"}, 2
	r := NewRecorder(0, 0, 0)
	r.Record(o)
	d := r.State(Sources{}, 1).Decisions[0]
	if want := "external/m score=0.5000; runner-up device/m score=0.9000; fallback; excluded lan: tier T1 not allowed"; d.Route != want {
		t.Fatalf("route %q, want %q", d.Route, want)
	}
	if d.Redactions["EMAIL"] != 2 || len(d.Redactions) != 1 || d.Findings["PHONE"] != 1 || d.Redacted != 2 {
		t.Fatalf("redactions %v findings %v", d.Redactions, d.Findings)
	}
	if len(d.Attempts) != 2 || d.Attempts[0].Failure != "connect" || !d.Attempts[1].Delivered || d.Tier != "T3" || d.CostUSD != 0.1 {
		t.Fatalf("attempts %+v tier %s", d.Attempts, d.Tier)
	}
}

// TestHandlerServesThePageAndTheState: the page is self-contained (no
// external URL, a CSP that allows nothing from elsewhere); the state is JSON
// with the engine's adapters and their shares; other methods are 405.
func TestHandlerServesThePageAndTheState(t *testing.T) {
	r := NewRecorder(0, 0, 0)
	r.Record(answered("ann", "billing", device, 0))
	h := &Handler{Recorder: r, Sources: Sources{Engine: func() (observe.EngineState, bool) {
		return observe.EngineState{Model: "molly-demo", Busy: 1, Free: 3, Adapters: []observe.Adapter{{Name: "billing", State: "hot", Uses: 3}, {Name: "legal", State: "cold", Uses: 1}}}, true
	}}}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/console", nil))
	body := rec.Body.String()
	if rec.Code != 200 || !strings.HasPrefix(rec.Header().Get("Content-Type"), "text/html") || !strings.Contains(rec.Header().Get("Content-Security-Policy"), "default-src 'none'") ||
		strings.Contains(body, "src=\"http") || strings.Contains(body, "href=\"http") || !strings.Contains(body, "<svg") {
		t.Fatalf("page: %d %v", rec.Code, rec.Header())
	}
	rec = httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/console/state", nil))
	var s State
	if err := json.Unmarshal(rec.Body.Bytes(), &s); err != nil || s.Engine == nil || s.Engine.KVShare != 0.25 || s.Engine.Share["billing"] != 0.75 || s.Tiers["T0"] != 1 {
		t.Fatalf("state: %v %s", err, rec.Body.String())
	}
	for _, path := range []string{"/console/", "/"} {
		rec = httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
		if rec.Code != 200 || !strings.HasPrefix(rec.Header().Get("Content-Type"), "text/html") {
			t.Fatalf("GET %s: %d, want the page", path, rec.Code)
		}
	}
	for _, path := range []string{"/console/anything-unknown", "/console/state/x", "/consolex"} {
		rec = httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
		var nf struct {
			Error struct{ Code, Type string } `json:"error"`
		}
		if err := json.Unmarshal(rec.Body.Bytes(), &nf); rec.Code != http.StatusNotFound || err != nil || nf.Error.Code != "not_found" {
			t.Fatalf("GET %s: %d %s, want a 404 not_found", path, rec.Code, rec.Body.String())
		}
	}
	rec = httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/console/state", nil))
	var e struct {
		Error struct{ Code, Type string } `json:"error"`
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &e); rec.Code != http.StatusMethodNotAllowed || err != nil ||
		e.Error.Code != "method_not_supported" || rec.Header().Get("Allow") != "GET, HEAD" {
		t.Fatalf("POST: %d Allow %q %s", rec.Code, rec.Header().Get("Allow"), rec.Body.String())
	}
}
