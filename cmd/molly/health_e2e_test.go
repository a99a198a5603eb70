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
	"github.com/tidwall/gjson"

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

// TestASchemaBeyondTheGrammarLimitIsA400AndNeverEjectsTheEngine: a
// response_format, a tool's parameters or a Responses text.format whose
// repetition bound llama.cpp's grammar parser cannot take is a 400 from
// the T0 engine naming the keyword and the limit, relayed as it is. More
// of them than consecutive_5xx (5 by default) leave the engine's circuit
// closed: the next ordinary request is served by it.
func TestASchemaBeyondTheGrammarLimitIsA400AndNeverEjectsTheEngine(t *testing.T) {
	admin := adminSocket(t)
	g := startEngineMolly(t, "tiny", 2048, "admin "+admin+"|0600")
	const msgs = `"messages":[{"role":"user","content":"hi"}]`
	str, arr := `{"type":"string","minLength":5000}`, `{"type":"array","minItems":5000}`
	cases := []struct{ name, path, body, param, keyword string }{
		{"response_format, minLength", "/v1/chat/completions", `{"model":"chat",` + msgs + `,"response_format":{"type":"json_schema","json_schema":{"name":"r","schema":` + str + `}}}`, "response_format.json_schema.schema", "minLength"},
		{"response_format, minItems", "/v1/chat/completions", `{"model":"chat",` + msgs + `,"response_format":{"type":"json_schema","json_schema":{"name":"r","schema":` + arr + `}}}`, "response_format.json_schema.schema", "minItems"},
		{"streamed", "/v1/chat/completions", `{"model":"chat","stream":true,` + msgs + `,"response_format":{"type":"json_schema","json_schema":{"name":"r","schema":` + str + `}}}`, "response_format.json_schema.schema", "minLength"},
		{"a tool's parameters", "/v1/chat/completions", `{"model":"chat",` + msgs + `,"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object","properties":{"a":` + str + `}}}}]}`, "tools[0].function.parameters", "minLength"},
		{"Responses text.format", "/v1/responses", `{"model":"chat","input":"hi","text":{"format":{"type":"json_schema","name":"r","schema":` + str + `}}}`, "text.format.schema", "minLength"},
		{"response_format again", "/v1/chat/completions", `{"model":"chat",` + msgs + `,"response_format":{"type":"json_schema","json_schema":{"name":"r","schema":` + str + `}}}`, "response_format.json_schema.schema", "minLength"},
	}
	for _, c := range cases {
		resp, b := do(t, g, "POST", c.path, c.body)
		msg := gjson.GetBytes(b, "error.message").Str
		if resp.StatusCode != http.StatusBadRequest || gjson.GetBytes(b, "error.type").Str != "invalid_request_error" ||
			!strings.Contains(msg, `"`+c.keyword+`"`) || !strings.Contains(msg, "at most 2000") ||
			(c.param != "" && gjson.GetBytes(b, "error.param").Str != c.param) || resp.Header.Get("Retry-After") != "" {
			t.Fatalf("%s: %d %s (Retry-After %q), want 400 invalid_request_error naming %s and the limit", c.name, resp.StatusCode, b, resp.Header.Get("Retry-After"), c.keyword)
		}
	}
	resp, b := do(t, g, "POST", "/v1/chat/completions", `{"model":"chat","max_tokens":4,`+msgs+`}`)
	if resp.StatusCode != http.StatusOK || resp.Header.Get("X-Molly-Target") != "device" || gjson.GetBytes(b, "usage.completion_tokens").Int() != 4 {
		t.Fatalf("an ordinary request after %d refused schemas: %d %s (target %q)", len(cases), resp.StatusCode, b, resp.Header.Get("X-Molly-Target"))
	}
	code, body := adminCall(t, admin, http.MethodGet, "/molly/targets", nil)
	if dev := gjson.Get(body, `#(target=="device")`); code != http.StatusOK || dev.Get("state").Str != "closed" || dev.Get("interval_failures").Int() != 0 || dev.Get("ejections").Int() != 0 {
		t.Fatalf("/molly/targets: %d %s, want the device's circuit closed", code, body)
	}
}
