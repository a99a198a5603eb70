package pipeline

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/molly-gateway/molly/internal/upstreamtest"
	"github.com/molly-gateway/molly/router/health"
	"github.com/molly-gateway/molly/router/route"
)

// hung is an upstream that takes requests and never answers (until the
// caller gives up or the test ends).
func hung(t *testing.T) (*httptest.Server, *atomic.Int64) {
	var n atomic.Int64
	stop := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n.Add(1)
		_, _ = io.Copy(io.Discard, r.Body)
		select {
		case <-r.Context().Done():
		case <-stop:
		}
	}))
	t.Cleanup(func() { close(stop); srv.Close() })
	return srv, &n
}

// withHealth builds the pipeline's tracker from the catalogue's targets.
func withHealth(t *testing.T, base health.Config) func(*Pipeline) {
	return func(p *Pipeline) {
		cfg := map[string]health.Config{}
		for _, tg := range p.Catalogue.Targets() {
			c := base
			if tg.OutlierDetection != nil {
				c = tg.OutlierDetection.Merge(base)
			}
			cfg[tg.Name] = c
		}
		tr, err := health.New(cfg, health.Options{})
		if err != nil {
			t.Fatal(err)
		}
		p.Health = tr
	}
}

// waitFor polls cond until it holds or 10 s pass.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

// TestAHungUpstreamCostsOnlyTheFirstRequestsATimeout: after
// consecutive_5xx timeouts the hung target is out of every plan (the
// answer says so in X-Molly-Route) and later requests never wait for it;
// once the ejection time is over, exactly one probe is let through while
// concurrent requests keep going to the fallback, and the failed probe
// ejects it again.
func TestAHungUpstreamCostsOnlyTheFirstRequestsATimeout(t *testing.T) {
	h, hits := hung(t)
	lan := upstreamtest.Start("lan")
	t.Cleanup(lan.Close)
	gw, p := startGateway(t, setup{targets: []*route.Target{
		{Name: "hung", Tier: "T1", Endpoint: h.URL + "/v1", Models: []string{"m"}, Quality: map[string]float64{"default": 0.9}, TimeoutMS: 150,
			OutlierDetection: &health.Config{Consecutive5xx: 3, BaseEjectionTime: health.Duration(400 * time.Millisecond)}},
		{Name: "lan", Tier: "T1", Endpoint: lan.URL(), Models: []string{"m"}, Quality: map[string]float64{"default": 0.5}},
	}, edit: withHealth(t, health.Config{})})
	for i := range 10 {
		r := post(t, gw.URL+"/v1/chat/completions", chatBody(fmt.Sprintf("hello %d", i)))
		if r.status != 200 || r.header.Get(HeaderTarget) != "lan" {
			t.Fatalf("request %d: %d from %q: %s", i, r.status, r.header.Get(HeaderTarget), r.body)
		}
		route := r.header.Get(HeaderRoute)
		ejected := strings.Contains(route, "excluded hung: circuit open (3 consecutive failures, the last: timeout)")
		if (i >= 3) != ejected {
			t.Fatalf("request %d: X-Molly-Route %q", i, route)
		}
	}
	if n := hits.Load(); n != 3 {
		t.Fatalf("the hung upstream got %d requests, want the first 3 only", n)
	}
	waitFor(t, "the half-open circuit", func() bool { ok, _ := p.Health.Admit("hung"); return ok })
	var wg sync.WaitGroup
	var bad atomic.Int64
	for i := range 12 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := post(t, gw.URL+"/v1/chat/completions", chatBody(fmt.Sprintf("again %d", i)))
			if r.status != 200 || r.header.Get(HeaderTarget) != "lan" {
				bad.Add(1)
			}
		}()
	}
	wg.Wait()
	if n := hits.Load(); n != 4 || bad.Load() != 0 {
		t.Fatalf("half-open: the hung upstream got %d requests in all (want 4: one probe); %d answers were not lan's", n, bad.Load())
	}
	st := p.Health.Snapshot()
	if st[0].Target != "hung" || st[0].State != health.StateOpen || st[0].EjectionsTotal[health.ReasonProbe] != 1 || st[0].Ejections != 2 {
		t.Fatalf("after the failed probe: %+v", st[0])
	}
}

// TestALatencyThresholdEjectsWhileTheFirstRequestsStillWait: with
// latency_threshold, two attempts waiting on a hung target eject it before
// their own timeout, so a third request goes straight to the fallback.
func TestALatencyThresholdEjectsWhileTheFirstRequestsStillWait(t *testing.T) {
	h, hits := hung(t)
	lan := upstreamtest.Start("lan")
	t.Cleanup(lan.Close)
	gw, p := startGateway(t, setup{targets: []*route.Target{
		{Name: "hung", Tier: "T1", Endpoint: h.URL + "/v1", Models: []string{"m"}, Quality: map[string]float64{"default": 0.9}, TimeoutMS: 3000,
			OutlierDetection: &health.Config{Consecutive5xx: 2, LatencyThreshold: health.Duration(50 * time.Millisecond), BaseEjectionTime: health.Duration(time.Hour)}},
		{Name: "lan", Tier: "T1", Endpoint: lan.URL(), Models: []string{"m"}},
	}, edit: withHealth(t, health.Config{})})
	var wg sync.WaitGroup
	for i := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if r := post(t, gw.URL+"/v1/chat/completions", chatBody(fmt.Sprintf("first %d", i))); r.status != 200 || r.header.Get(HeaderTarget) != "lan" {
				t.Errorf("a waiting request: %d %s", r.status, r.body)
			}
		}()
	}
	waitFor(t, "both requests at the hung upstream", func() bool { return hits.Load() == 2 })
	waitFor(t, "the ejection", func() bool { ok, _ := p.Health.Admit("hung"); return !ok })
	r := post(t, gw.URL+"/v1/chat/completions", chatBody("third"))
	if r.status != 200 || r.header.Get(HeaderTarget) != "lan" || !strings.Contains(r.header.Get(HeaderRoute), "no answer within latency_threshold 50ms") {
		t.Fatalf("third request: %d %q %s", r.status, r.header.Get(HeaderRoute), r.body)
	}
	if hits.Load() != 2 {
		t.Fatalf("the hung upstream got %d requests, want 2", hits.Load())
	}
	wg.Wait()
}

// TestAnOpenCircuitOnTheOnlyTargetFailsFast: with nothing left, the 503
// names the open circuit.
func TestAnOpenCircuitOnTheOnlyTargetFailsFast(t *testing.T) {
	srv, hits := failing(t, 500)
	gw, _ := startGateway(t, setup{targets: []*route.Target{
		{Name: "flaky", Tier: "T1", Endpoint: srv.URL + "/v1", Models: []string{"m"}, OutlierDetection: &health.Config{Consecutive5xx: 2}},
	}, edit: withHealth(t, health.Config{})})
	for i := range 4 {
		r := post(t, gw.URL+"/v1/chat/completions", chatBody("hi"))
		open := strings.Contains(r.body, "flaky: circuit open (2 consecutive failures, the last: server_error)")
		if r.status != 503 || (i >= 2) != open {
			t.Fatalf("request %d: %d %s", i, r.status, r.body)
		}
	}
	if hits.Load() != 2 {
		t.Fatalf("the failing upstream got %d requests, want 2", hits.Load())
	}
}

// TestABadAnswerFromTheLastCandidateIsA502: an upstream 200 that is not
// JSON falls back, and when it was the last candidate the client gets 502.
func TestABadAnswerFromTheLastCandidateIsA502(t *testing.T) {
	html := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html")
		_, _ = io.WriteString(w, "<html>captive portal</html>")
	}))
	t.Cleanup(html.Close)
	lan := upstreamtest.Start("lan")
	t.Cleanup(lan.Close)
	for _, tc := range []struct {
		name    string
		targets []*route.Target
		status  int
		code    string
	}{
		{"the only target", []*route.Target{{Name: "portal", Tier: "T1", Endpoint: html.URL + "/v1", Models: []string{"m"}}}, 502, "bad_upstream_answer"},
		{"with a fallback", []*route.Target{
			{Name: "portal", Tier: "T1", Endpoint: html.URL + "/v1", Models: []string{"m"}, Quality: map[string]float64{"default": 0.9}},
			{Name: "lan", Tier: "T1", Endpoint: lan.URL(), Models: []string{"m"}}}, 200, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			gw, _ := startGateway(t, setup{targets: tc.targets})
			for _, body := range []string{chatBody("hi"), streamBody("hi", false)} {
				r := post(t, gw.URL+"/v1/chat/completions", body)
				if r.status != tc.status || (tc.code != "" && !strings.Contains(r.body, `"code":"`+tc.code+`"`)) {
					t.Fatalf("%s: %d %s", body, r.status, r.body)
				}
			}
		})
	}
}

// TestRequestErrorsNeverOpenTheCircuit: a 4xx the upstream gives because of
// the request (here a 400 for a schema it cannot serve) is relayed to its
// client and counts as an answer, not a failure: many more of them than
// consecutive_5xx, and than the failure-percentage volume, leave the
// circuit closed, and other clients are served by the target.
func TestRequestErrorsNeverOpenTheCircuit(t *testing.T) {
	const refusal = `{"error":{"message":"JSON Schema keyword \"minLength\" is 5000; at most 2000","type":"invalid_request_error","param":"response_format","code":null}}`
	var hits atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		b, _ := io.ReadAll(r.Body)
		w.Header().Set("Content-Type", "application/json")
		if strings.Contains(string(b), "minLength") {
			w.WriteHeader(http.StatusBadRequest)
			_, _ = io.WriteString(w, refusal)
			return
		}
		_, _ = io.WriteString(w, `{"id":"c","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,"finish_reason":"stop","logprobs":null,"message":{"role":"assistant","content":"ok","refusal":null}}],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}`)
	}))
	t.Cleanup(srv.Close)
	gw, p := startGateway(t, setup{targets: []*route.Target{
		{Name: "only", Tier: "T1", Endpoint: srv.URL + "/v1", Models: []string{"m"},
			OutlierDetection: &health.Config{Consecutive5xx: 2, FailurePercentageRequestVolume: 3, FailurePercentageThreshold: 50, BaseEjectionTime: health.Duration(time.Hour)}},
	}, edit: withHealth(t, health.Config{})})
	bad := `{"model":"m","messages":[{"role":"user","content":"hi"}],"response_format":{"type":"json_schema","json_schema":{"name":"r","schema":{"type":"string","minLength":5000}}}}`
	const n = 8
	for i := range n {
		r := post(t, gw.URL+"/v1/chat/completions", bad)
		if r.status != http.StatusBadRequest || !strings.Contains(r.body, `"param":"response_format"`) || r.header.Get("Retry-After") != "" {
			t.Fatalf("refused request %d: %d %s", i, r.status, r.body)
		}
	}
	if r := post(t, gw.URL+"/v1/chat/completions", chatBody("hi")); r.status != http.StatusOK || r.header.Get("X-Molly-Target") != "only" {
		t.Fatalf("an ordinary request after %d refusals: %d %s", n, r.status, r.body)
	}
	if hits.Load() != n+1 {
		t.Fatalf("the upstream got %d requests, want %d", hits.Load(), n+1)
	}
	s := p.Health.Snapshot()
	if len(s) != 1 || s[0].State != health.StateClosed || s[0].Ejections != 0 || s[0].IntervalFailures != 0 || s[0].IntervalAttempts != n+1 {
		t.Fatalf("health %+v, want closed with %d attempts and no failures", s, n+1)
	}
}
