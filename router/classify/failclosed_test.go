package classify_test

// The fail-closed paths of a failed scan, where they are enforced: egress
// refuses a tier whose decision requires redaction, and the pipeline falls
// back to an allowed tier that needs none, or refuses. They live here
// because only this package's tests can make a detector fail
// (FailScansOn, export_test.go).

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"

	"github.com/tidwall/gjson"

	"github.com/molly-gateway/molly/internal/policytest"
	"github.com/molly-gateway/molly/internal/upstreamtest"
	"github.com/molly-gateway/molly/redaction"
	"github.com/molly-gateway/molly/router/classify"
	"github.com/molly-gateway/molly/router/egress"
	"github.com/molly-gateway/molly/router/openai"
	"github.com/molly-gateway/molly/router/pipeline"
	"github.com/molly-gateway/molly/router/route"
)

func failingClassifier(t *testing.T, overrides map[string]classify.Sensitivity) *classify.Classifier {
	t.Helper()
	sc, err := redaction.NewScanner(redaction.Config{})
	if err != nil {
		t.Fatal(err)
	}
	return classify.FailScansOn(classify.New(sc, overrides), "BOOM")
}

func TestAFailedScanRefusesARedactingTier(t *testing.T) {
	lan, cloud := &route.Target{Name: "lan", Tier: "T1", Endpoint: "http://127.0.0.1:1/v1", Models: []string{"m"}},
		&route.Target{Name: "cloud", Tier: "T3", Endpoint: "http://127.0.0.1:2/v1", Models: []string{"m"}}
	cat, err := route.NewCatalogue([]*route.Target{lan, cloud}, nil)
	if err != nil {
		t.Fatal(err)
	}
	eg, err := egress.New(cat, nil)
	if err != nil {
		t.Fatal(err)
	}
	body := `{"model":"m","messages":[{"role":"user","content":"mail alice@example.com"},{"role":"user","content":"BOOM"}]}`
	a, err := failingClassifier(t, map[string]classify.Sensitivity{"EMAIL": classify.Public}).Classify(classify.Input{Endpoint: openai.EndpointChat, Body: []byte(body)})
	if err != nil || !a.ScanFailed() {
		t.Fatalf("Classify = %v, %v; want a failed scan", a, err)
	}
	d := policytest.Decide(t, policytest.Literal(t, policytest.Allow([]string{"T1", "T3"}, map[string][]string{"T3": {"EMAIL"}}, nil)), a)
	disp, err := eg.NewDispatch(d, a, route.Candidate{Target: cloud, Model: "m"})
	if disp != nil || !errors.Is(err, egress.ErrScanFailed) ||
		err.Error() != "cloud (T3 redacts EMAIL): content scan failed, so the redaction the policy requires cannot be guaranteed" {
		t.Fatalf("NewDispatch(T3) = %v, %v; want a refusal", disp, err)
	}
	if disp, err := eg.NewDispatch(d, a, route.Candidate{Target: lan, Model: "m"}); err != nil || string(disp.Body()) != body {
		t.Fatalf("NewDispatch(T1) = %v; want the request unchanged, as the policy asks no redaction there", err)
	}
	t.Run("the default policy treats a failed scan as restricted", func(t *testing.T) {
		dec := policytest.Decide(t, policytest.Default(t), a).Decision()
		if !reflect.DeepEqual(dec.Tiers(), []string{"T0"}) || dec.Sensitivity() != "restricted" {
			t.Fatalf("tiers %v class %q (%v), want T0 restricted", dec.Tiers(), dec.Sensitivity(), dec.Reasons())
		}
	})
}

func TestThePipelineReroutesOrRefusesAfterAFailedScan(t *testing.T) {
	lanUp, cloudUp := upstreamtest.Start("lan"), upstreamtest.Start("cloud")
	t.Cleanup(func() { lanUp.Close(); cloudUp.Close() })
	cls := failingClassifier(t, nil)
	const body = `{"model":"m","messages":[{"role":"user","content":"BOOM alice@example.com"}]}`
	cases := []struct {
		name    string
		tiers   []string
		status  int
		target  string
		message string
	}{
		{"the request goes to an allowed tier that needs no redaction", []string{"T1", "T3"}, 200, "lan", ""},
		{"with only redacting tiers allowed it is refused with the reason (403: no retry makes the scan succeed)", []string{"T3"}, 403, "",
			"All allowed targets for model `m` failed (lan: tier T1 not allowed by the policy; cloud: cloud (T3 redacts EMAIL): content scan failed, so the redaction the policy requires cannot be guaranteed)."},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cat, err := route.NewCatalogue([]*route.Target{
				{Name: "lan", Tier: "T1", Endpoint: lanUp.URL(), Models: []string{"m"}, Quality: map[string]float64{"default": 0.5}},
				{Name: "cloud", Tier: "T3", Endpoint: cloudUp.URL(), Models: []string{"m"}, Quality: map[string]float64{"default": 0.9}},
			}, nil)
			if err != nil {
				t.Fatal(err)
			}
			eg, err := egress.New(cat, nil)
			if err != nil {
				t.Fatal(err)
			}
			policy := policytest.Literal(t, policytest.Allow(tc.tiers, map[string][]string{"T3": {"EMAIL"}}, nil))
			p := &pipeline.Pipeline{Catalogue: cat, Egress: eg, Policy: policy, Weights: route.DefaultWeights}
			a, err := cls.Classify(classify.Input{Endpoint: openai.EndpointChat, Body: []byte(body)})
			if err != nil {
				t.Fatal(err)
			}
			rec := httptest.NewRecorder()
			err = p.Serve(rec, httptest.NewRequest(http.MethodPost, "/v1/chat/completions", strings.NewReader(body)), a, p.Decide(context.Background(), a, nil))
			if tc.status != 200 {
				var ae *openai.Error
				if !errors.As(err, &ae) || ae.Status != tc.status || ae.Message != tc.message {
					t.Fatalf("Serve error = %v, want %d %q", err, tc.status, tc.message)
				}
				if cloudUp.Count() != 0 {
					t.Fatal("the cloud received the request")
				}
				return
			}
			resp := rec.Result()
			b, _ := io.ReadAll(resp.Body)
			if err != nil || resp.StatusCode != 200 || resp.Header.Get(pipeline.HeaderTarget) != tc.target || gjson.GetBytes(b, "choices.0.message.content").String() != "lan says: BOOM alice@example.com" {
				t.Fatalf("Serve = %v, status %d target %q: %s", err, resp.StatusCode, resp.Header.Get(pipeline.HeaderTarget), b)
			}
			if !strings.HasSuffix(resp.Header.Get(pipeline.HeaderRoute), "; fallback") || cloudUp.Count() != 0 {
				t.Fatalf("route %q, cloud got %d requests", resp.Header.Get(pipeline.HeaderRoute), cloudUp.Count())
			}
		})
	}
}
