package egress

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/molly-gateway/molly/router/route"
)

func TestHealthProbesEveryTargetOnceAWhile(t *testing.T) {
	var calls atomic.Int64
	status := func(code int) *httptest.Server {
		s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			calls.Add(1)
			if r.URL.Path != "/v1/models" || r.Method != http.MethodGet || r.ContentLength > 0 {
				t.Errorf("probe %s %s with %d bytes", r.Method, r.URL.Path, r.ContentLength)
			}
			w.WriteHeader(code)
		}))
		t.Cleanup(s.Close)
		return s
	}
	up, nomodels, badkey := status(200), status(404), status(401)
	dead := httptest.NewServer(http.NotFoundHandler())
	dead.Close()
	cat, err := route.NewCatalogue([]*route.Target{
		{Name: "up", Tier: "T1", Endpoint: up.URL + "/v1", Models: []string{"m"}},
		{Name: "nomodels", Tier: "T1", Endpoint: nomodels.URL + "/v1", Models: []string{"m"}},
		{Name: "badkey", Tier: "T3", Endpoint: badkey.URL + "/v1", Models: []string{"m"}},
		{Name: "dead", Tier: "T2", Endpoint: dead.URL + "/v1", Models: []string{"m"}},
		// Its key's variable is unset: reported, never probed (the up server would say 200).
		{Name: "nokey", Tier: "T3", Endpoint: up.URL + "/v1", Models: []string{"m"}, APIKeyEnv: "MOLLY_TEST_PROBE_KEY_NEVER_SET"},
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	e, err := New(cat, nil)
	if err != nil {
		t.Fatal(err)
	}
	got := e.Health(context.Background(), cat)
	want := map[string]bool{"up": true, "nomodels": true, "badkey": false, "dead": false, "nokey": false}
	for _, h := range got {
		if h.OK != want[h.Target] || (h.OK != (h.Error == "")) {
			t.Fatalf("%s: ok %v error %q", h.Target, h.OK, h.Error)
		}
	}
	if !strings.Contains(got[3].Error, "refused") || !strings.Contains(got[2].Error, "401") || got[4].Error != "api_key_env MOLLY_TEST_PROBE_KEY_NEVER_SET is not set" {
		t.Fatalf("errors %q, %q, %q", got[3].Error, got[2].Error, got[4].Error)
	}
	n := calls.Load()
	e.Health(context.Background(), cat) // within ProbeTTL: the outcomes are reused
	if calls.Load() != n || n != 3 {
		t.Fatalf("%d probes, then %d", n, calls.Load())
	}
}
