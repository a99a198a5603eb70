package route_test

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/molly-gateway/molly/policies"
	"github.com/molly-gateway/molly/redaction"
	"github.com/molly-gateway/molly/router/classify"
	"github.com/molly-gateway/molly/router/identity"
	"github.com/molly-gateway/molly/router/openai"
	"github.com/molly-gateway/molly/router/route"
)

var update = flag.Bool("update", false, "rewrite testdata/plans/*.plan.json from the current code")

// planCase is testdata/plans/<name>.request.json: a catalogue, strategy
// settings, a request (body, headers) and its caller.
type planCase struct {
	Targets    []*route.Target `json:"targets"`
	Strategies struct {
		Cascade   *route.Cascade `json:"cascade"`
		Mixture   *route.Mixture `json:"mixture"`
		Tools     bool           `json:"tools"`
		ToolSteps int            `json:"tool_steps"`
	} `json:"strategies"`
	Body      json.RawMessage    `json:"body"`
	Headers   map[string]string  `json:"headers"`
	Declared  string             `json:"declared"`
	Residency string             `json:"residency"`
	Identity  *identity.Identity `json:"identity"`
}

// golden is what a plan file holds: the decision the default policy made
// (tiers, redaction) and the plan.
type golden struct {
	Decision struct {
		Allow   bool                `json:"allow"`
		Tiers   []string            `json:"tiers"`
		Redact  map[string][]string `json:"redact"`
		Reasons []string            `json:"reasons"`
	} `json:"decision"`
	Plan route.Plan `json:"plan"`
}

// TestPlans computes the Plan of every request in testdata/plans with the
// real classifier and the embedded default policy, and compares it with
// the checked-in <name>.plan.json (go test -run TestPlans -update rewrites
// them; review the diff).
func TestPlans(t *testing.T) {
	scanner, err := redaction.NewScanner(redaction.Config{})
	if err != nil {
		t.Fatal(err)
	}
	cl := classify.New(scanner, nil)
	pol, err := policies.New(context.Background(), policies.Options{})
	if err != nil {
		t.Fatal(err)
	}
	files, _ := filepath.Glob("testdata/plans/*.request.json")
	if len(files) == 0 {
		t.Fatal("no testdata/plans/*.request.json")
	}
	for _, f := range files {
		name := strings.TrimSuffix(filepath.Base(f), ".request.json")
		t.Run(name, func(t *testing.T) {
			raw, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			var c planCase
			if err := json.Unmarshal(raw, &c); err != nil {
				t.Fatal(err)
			}
			cat, err := route.NewCatalogue(c.Targets, nil)
			if err != nil {
				t.Fatal(err)
			}
			a, err := cl.Classify(classify.Input{Endpoint: openai.EndpointChat, Body: c.Body, Declared: c.Declared, Residency: c.Residency})
			if err != nil {
				t.Fatal(err)
			}
			d := pol.Decide(context.Background(), policies.Input{Subject: a, Identity: c.Identity.PolicyInput(), Targets: cat.PolicyView()})
			dec := d.Decision()
			h := http.Header{}
			for k, v := range c.Headers {
				h.Set(k, v)
			}
			o, aerr := route.ParseOverrides(h)
			if aerr != nil {
				t.Fatal(aerr)
			}
			sel := route.Selection{Weights: route.DefaultWeights, Overrides: o}
			if c.Identity != nil && c.Identity.Budgeted {
				sel.Budgeted, sel.RemainingUSD = true, c.Identity.RemainingUSD
			}
			cfg := route.Config{Cascade: c.Strategies.Cascade, Mixture: c.Strategies.Mixture, Tools: c.Strategies.Tools, ToolSteps: c.Strategies.ToolSteps}
			var g golden
			g.Decision.Allow, g.Decision.Tiers, g.Decision.Reasons = dec.Allowed(), dec.Tiers(), dec.Reasons()
			g.Decision.Redact = map[string][]string{}
			for _, tier := range dec.Tiers() {
				if r := dec.Redact(tier); len(r) > 0 {
					g.Decision.Redact[tier] = r
				}
			}
			if dec.Allowed() {
				g.Plan = cat.NewPlan(a, dec, sel, cfg)
			}
			got, err := json.MarshalIndent(g, "", "  ")
			if err != nil {
				t.Fatal(err)
			}
			got = append(got, '\n')
			path := strings.TrimSuffix(f, ".request.json") + ".plan.json"
			if *update {
				if err := os.WriteFile(path, got, 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("%v (run go test -run TestPlans -update to create it)", err)
			}
			if !bytes.Equal(got, want) {
				t.Fatalf("plan of %s differs from %s:\n%s", f, path, got)
			}
		})
	}
}
