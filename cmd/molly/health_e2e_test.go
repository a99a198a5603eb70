package main

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/openai/openai-go/v3/option"

	"github.com/molly-gateway/molly/internal/upstreamtest"
)

// TestAFailingTargetIsEjectedAndItsHealthShown: a target that answers
// 500 is ejected after consecutive_5xx attempts; from then on answers come
// from the other target without trying it, X-Molly-Route says why, and
// /molly/targets, `molly targets` and the metrics on the admin socket
// show the open circuit.
func TestAFailingTargetIsEjectedAndItsHealthShown(t *testing.T) {
	var hits atomic.Int64
	flaky := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		http.Error(w, `{"error":{"message":"down","type":"server_error"}}`, http.StatusBadGateway)
	}))
	t.Cleanup(flaky.Close)
	lan := upstreamtest.Start("t1")
	t.Cleanup(lan.Close)
	admin := adminSocket(t)
	g := startMolly(t, `{
	admin `+admin+`|0600
	auto_https off
	persist_config off
	molly {
		outlier_detection {
			consecutive_5xx 2
			base_ejection_time 1h
		}
		target flaky {
			tier T1
			endpoint `+flaky.URL+`/v1
			models chat=m
			quality 0.9
		}
		target lan {
			tier T1
			endpoint `+lan.URL()+`
			models chat=small-lan
			quality 0.5
		}
	}
}
http://127.0.0.1:{PORT} {
	molly_classify
	molly_policy
	molly_route
}
`)
	c := client(g)
	for i := range 5 {
		var resp *http.Response
		if _, err := c.Chat.Completions.New(t.Context(), chat("hello"), option.WithResponseInto(&resp)); err != nil {
			t.Fatal(err)
		}
		if route := resp.Header.Get("X-Molly-Route"); (i >= 2) != strings.Contains(route, "excluded flaky: circuit open (2 consecutive failures, the last: server_error)") {
			t.Fatalf("request %d: X-Molly-Route %q", i, route)
		}
	}
	if hits.Load() != 2 {
		t.Fatalf("the failing target got %d requests, want 2", hits.Load())
	}
	code, body := adminCall(t, admin, http.MethodGet, "/molly/targets", nil)
	var ts []struct {
		Target, Tier, State, Reason string
		Ejections                   int
	}
	if err := json.Unmarshal([]byte(body), &ts); code != 200 || err != nil || len(ts) != 2 {
		t.Fatalf("/molly/targets: %d %s", code, body)
	}
	if ts[0].Target != "flaky" || ts[0].State != "open" || ts[0].Ejections != 1 || !strings.Contains(ts[0].Reason, "2 consecutive failures") || ts[1].State != "closed" {
		t.Fatalf("/molly/targets: %s", body)
	}
	out, err := exec.Command(mollyBin, "targets", "--address", admin).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "flaky") || !strings.Contains(string(out), "open") {
		t.Fatalf("molly targets: %v\n%s", err, out)
	}
	hc, base := adminHTTP(admin)
	resp, err := hc.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{`molly_target_ejected{target="flaky"} 1`, `molly_target_ejected{target="lan"} 0`,
		`molly_target_ejections_total{reason="consecutive_5xx",target="flaky"} 1`, `molly_target_circuit_state{state="open",target="flaky"} 1`} {
		if !strings.Contains(string(b), want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
}
