package pipeline

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/tidwall/gjson"

	"github.com/molly-gateway/molly/internal/openapitest"
	"github.com/molly-gateway/molly/router/meter"
	"github.com/molly-gateway/molly/router/openai"
	"github.com/molly-gateway/molly/router/relay"
	"github.com/molly-gateway/molly/router/route"
)

func TestNoTargetSaysWhetherRetryingCanHelp(t *testing.T) {
	tests := []struct {
		name       string
		excluded   []route.Exclusion
		tried      []failed
		status     int
		code       string
		param      string
		retryAfter int
		noRetry    bool
	}{
		{"every target excluded by the policy: 403", []route.Exclusion{{Target: "a", Kind: route.ExcludedPolicy}}, nil, 403, "target_not_allowed", "", 0, false},
		{"a context window beats a policy exclusion: 400 the client can act on",
			[]route.Exclusion{{Target: "a", Kind: route.ExcludedPolicy}, {Target: "b", Kind: route.ExcludedContext}}, nil, 400, "context_length_exceeded", "messages", 0, false},
		{"a missing capability names its parameter", []route.Exclusion{{Target: "a", Kind: route.ExcludedCapability, Need: route.CapJSONSchema}}, nil, 400, "unsupported_parameter", "response_format", 0, false},
		{"missing audio output names modalities", []route.Exclusion{{Target: "a", Kind: route.ExcludedCapability, Need: route.CapAudio}}, nil, 400, "unsupported_parameter", "modalities", 0, false},
		{"a modality", []route.Exclusion{{Target: "a", Kind: route.ExcludedModality}}, nil, 400, "unsupported_modality", "messages", 0, false},
		{"an endpoint", []route.Exclusion{{Target: "a", Kind: route.ExcludedEndpoint}}, nil, 400, "unsupported_endpoint", "", 0, false},
		{"the client's cost cap", []route.Exclusion{{Target: "a", Kind: route.ExcludedCost}}, nil, 400, "max_cost_exceeded", route.HeaderMaxCost, 0, false},
		{"the remaining budget: 429 no SDK retries", []route.Exclusion{{Target: "a", Kind: route.ExcludedBudget}}, nil, 429, "insufficient_quota", "", 0, true},
		{"a missing API key: the gateway's 500, no SDK retries", []route.Exclusion{{Target: "a", Kind: route.ExcludedPolicy}, {Target: "b", Kind: route.ExcludedKey}}, nil, 500, "target_not_configured", "", 0, true},
		{"an open circuit beats a missing key: 503, worth a retry", []route.Exclusion{{Target: "a", Kind: route.ExcludedKey}, {Target: "b", Kind: route.ExcludedHealth}}, nil, 503, "no_target_available", "", 1, false},
		{"a context window beats a missing key: 400 the client can act on", []route.Exclusion{{Target: "a", Kind: route.ExcludedKey}, {Target: "b", Kind: route.ExcludedContext}}, nil, 400, "context_length_exceeded", "messages", 0, false},
		{"every attempt rate-limited: 429 with the longest Retry-After", nil,
			[]failed{{target: "a", kind: failRateLimited, retryAfter: 3}, {target: "b", kind: failRateLimited, retryAfter: 20}}, 429, "rate_limit_exceeded", "", 20, false},
		{"rate-limited without Retry-After waits a second", nil, []failed{{target: "a", kind: failRateLimited}}, 429, "rate_limit_exceeded", "", 1, false},
		{"every attempt timed out: 504", nil, []failed{{target: "a", kind: failTimeout}, {target: "b", kind: failTimeout}}, 504, "upstream_timeout", "", 0, false},
		{"every dispatch refused: 403", nil, []failed{{target: "a", kind: failRefused}}, 403, "redaction_unavailable", "", 0, false},
		{"answers that were not answers: 502", nil, []failed{{target: "a", kind: failBadAnswer}, {target: "b", kind: failTooLarge}}, 502, "bad_upstream_answer", "", 0, false},
		{"connect errors and 5xx: transient, 503 with Retry-After", nil, []failed{{target: "a", kind: failConnect}, {target: "b", kind: failServer}}, 503, "no_target_available", "", 1, false},
		{"a timeout and a 429 together: 503", nil, []failed{{target: "a", kind: failTimeout}, {target: "b", kind: failRateLimited}}, 503, "no_target_available", "", 1, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := noTarget("No target", tt.excluded, tt.tried)
			if e.Status != tt.status || e.Code != tt.code || e.Param != tt.param || e.RetryAfter != tt.retryAfter || e.NoRetry != tt.noRetry {
				t.Fatalf("got %d %s param %q Retry-After %d no-retry %v", e.Status, e.Code, e.Param, e.RetryAfter, e.NoRetry)
			}
			rec := httptest.NewRecorder()
			e.Write(rec)
			if got := rec.Header().Get(openai.HeaderShouldRetry); (got == "false") != tt.noRetry {
				t.Fatalf("x-should-retry %q", got)
			}
		})
	}
	for in, want := range map[string]int{"": 0, "7": 7, " 12 ": 12, "-3": 0, "soon": 0, time.Now().Add(90 * time.Second).UTC().Format(http.TimeFormat): 90} {
		if got := retryAfter(in); got < want-1 || got > want {
			t.Errorf("retryAfter(%q) = %d, want %d", in, got, want)
		}
	}
}

// quirkyStream is an upstream whose stream has a frame that is not JSON,
// upstream event:, id: and retry: lines, and no [DONE] after its finish.
func quirkyStream(t *testing.T) *httptest.Server {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(w, "event: message\nid: 9\nretry: 10\ndata: {\"id\":\"x\",\"object\":\"chat.completion.chunk\",\"created\":3,\"model\":\"up\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hel\"}}]}\n\n"+
			"data: <html>oops</html>\n\n"+
			"data: {\"id\":\"x\",\"object\":\"chat.completion.chunk\",\"created\":3,\"model\":\"up\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"lo\"},\"finish_reason\":\"stop\"}],\"usage\":{\"prompt_tokens\":4,\"completion_tokens\":2}}\n\n")
	}))
	t.Cleanup(srv.Close)
	return srv
}

func TestRelayedStreamsAreCleanedAndCounted(t *testing.T) {
	spec := openapitest.Load(t)
	up := quirkyStream(t)
	metrics, reg := meter.NewMetrics(), prometheus.NewRegistry()
	if err := metrics.Register(reg); err != nil {
		t.Fatal(err)
	}
	gw, _ := startGateway(t, setup{targets: []*route.Target{{Name: "up", Tier: "T1", Endpoint: up.URL + "/v1", Models: []string{"m"}}},
		edit: func(p *Pipeline) { p.Metrics = metrics }})
	for _, includeUsage := range []bool{true, false} {
		body := `{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}`
		if includeUsage {
			body = `{"model":"m","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"hi"}]}`
		}
		r := post(t, gw.URL+"/v1/chat/completions", body)
		if strings.Contains(r.body, "event:") || strings.Contains(r.body, "id:") || strings.Contains(r.body, "retry:") || strings.Contains(r.body, "oops") {
			t.Fatalf("upstream lines reached the client:\n%s", r.body)
		}
		d := relay.NewDecoder(bytes.NewReader([]byte(r.body)))
		var chunks []string
		done := false
		for {
			ev, err := d.Next()
			if err != nil {
				break
			}
			if ev.IsDone() {
				done = true
				continue
			}
			spec.Validate(t, "CreateChatCompletionStreamResponse", ev.Data)
			chunks = append(chunks, string(ev.Data))
		}
		last := gjson.Parse(chunks[len(chunks)-1])
		if !done || gjson.Get(chunks[0], "choices.0.delta.role").Str != "assistant" || gjson.Get(chunks[0], "model").Str != "m" {
			t.Fatalf("done %v, chunks %v", done, chunks)
		}
		if includeUsage != (last.Get("choices.#").Int() == 0 && last.Get("usage.total_tokens").Int() == 6) {
			t.Fatalf("include_usage %v: last chunk %s", includeUsage, last.Raw)
		}
	}
	if got := metricValue(t, reg, "molly_stream_malformed_events_total", map[string]string{"target": "up", "reason": "not_json"}); got != 2 {
		t.Fatalf("malformed events counted: %v, want 2", got)
	}
}
