package main

import (
	"context"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"regexp"
	"sync"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	coltrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"

	"github.com/molly-gateway/molly/internal/upstreamtest"
	"github.com/molly-gateway/molly/serving"
)

// otlpReceiver is an OTLP/HTTP trace receiver (protobuf encoding, the
// OTLP specification's /v1/traces): it keeps every span it is sent.
type otlpReceiver struct {
	srv   *httptest.Server
	mu    sync.Mutex
	spans []*tracepb.Span
}

func startOTLP(t *testing.T) *otlpReceiver {
	rc := &otlpReceiver{}
	rc.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		var req coltrace.ExportTraceServiceRequest
		if err != nil || r.URL.Path != "/v1/traces" || proto.Unmarshal(body, &req) != nil {
			http.Error(w, "bad export", http.StatusBadRequest)
			return
		}
		rc.mu.Lock()
		for _, rs := range req.ResourceSpans {
			for _, ss := range rs.ScopeSpans {
				rc.spans = append(rc.spans, ss.Spans...)
			}
		}
		rc.mu.Unlock()
		out, _ := proto.Marshal(&coltrace.ExportTraceServiceResponse{})
		w.Header().Set("Content-Type", "application/x-protobuf")
		_, _ = w.Write(out)
	}))
	t.Cleanup(rc.srv.Close)
	return rc
}

// trace returns the spans of traceID once one named last has arrived
// (the batch exporter sends them a little after the answer), or fails.
func (rc *otlpReceiver) trace(t *testing.T, traceID []byte, last string) []*tracepb.Span {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		rc.mu.Lock()
		var out []*tracepb.Span
		done := false
		for _, s := range rc.spans {
			if string(s.TraceId) == string(traceID) {
				out = append(out, s)
				done = done || s.Name == last
			}
		}
		rc.mu.Unlock()
		if done {
			return out
		}
		if time.Now().After(deadline) {
			t.Fatalf("no span %q in trace %x within 15s; got %d spans", last, traceID, len(out))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func attr(s *tracepb.Span, key string) *commonpb.AnyValue {
	for _, kv := range s.Attributes {
		if kv.Key == key {
			return kv.Value
		}
	}
	return nil
}

func attrString(s *tracepb.Span, key string) string {
	if v := attr(s, key); v != nil {
		if sv, ok := v.Value.(*commonpb.AnyValue_StringValue); ok {
			return sv.StringValue
		}
		if iv, ok := v.Value.(*commonpb.AnyValue_IntValue); ok {
			return fmt.Sprint(iv.IntValue)
		}
		if bv, ok := v.Value.(*commonpb.AnyValue_BoolValue); ok {
			return fmt.Sprint(bv.BoolValue)
		}
	}
	return ""
}

// TestTracesOneRequestAcrossTheWalk: with Caddy's tracing directive and the
// exporter set by OTEL_* variables (Caddy's convention), one request with
// a client traceparent gives one trace: Caddy's server span under the
// client's span; auth, classify, policy and route under it; plan, one
// client span per attempt (the failed one marked) and the delivery under
// route, with the GenAI attributes; and the upstream receives the
// delivering attempt's span as its traceparent.
func TestTracesOneRequestAcrossTheWalk(t *testing.T) {
	rc := startOTLP(t)
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", rc.srv.URL)
	t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
	t.Setenv("OTEL_TRACES_EXPORTER", "otlp")
	t.Setenv("OTEL_BSP_SCHEDULE_DELAY", "100") // ms: export soon after the request
	lan := upstreamtest.Start("lan")
	t.Cleanup(lan.Close)
	g := startMolly(t, `{
	admin off
	auto_https off
	persist_config off
	molly {
		registry `+t.TempDir()+`/molly.db
		target broken {
			tier T2
			endpoint http://127.0.0.1:1/v1
			models chat=big
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
	tracing {
		span molly
	}
	molly_auth {
		anonymous local
	}
	molly_classify
	molly_policy
	molly_route
}
`)
	const clientTrace, clientSpan = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
	var resp *http.Response
	if _, err := client(g).Chat.Completions.New(context.Background(), chat("hello there"), option.WithResponseInto(&resp),
		option.WithHeader("Traceparent", "00-"+clientTrace+"-"+clientSpan+"-01")); err != nil {
		t.Fatal(err)
	}
	traceID, _ := hex.DecodeString(clientTrace)
	spans := rc.trace(t, traceID, "molly")
	byName := map[string][]*tracepb.Span{}
	for _, s := range spans {
		byName[s.Name] = append(byName[s.Name], s)
	}
	one := func(name string) *tracepb.Span {
		if len(byName[name]) != 1 {
			var names []string
			for _, s := range spans {
				names = append(names, s.Name)
			}
			t.Fatalf("want one span %q, trace has %v", name, names)
		}
		return byName[name][0]
	}
	server := one("molly")
	if hex.EncodeToString(server.ParentSpanId) != clientSpan || server.Kind != tracepb.Span_SPAN_KIND_SERVER {
		t.Fatalf("server span: parent %x kind %v, want the client's %s", server.ParentSpanId, server.Kind, clientSpan)
	}
	childOf := func(s, parent *tracepb.Span) {
		t.Helper()
		if string(s.ParentSpanId) != string(parent.SpanId) {
			t.Errorf("span %q: parent %x, want %q (%x)", s.Name, s.ParentSpanId, parent.Name, parent.SpanId)
		}
	}
	auth, cls, pol, rt := one("molly.auth"), one("molly.classify"), one("molly.policy"), one("molly.route")
	for _, s := range []*tracepb.Span{auth, cls, pol, rt} {
		childOf(s, server)
	}
	plan, deliver := one("molly.plan"), one("molly.deliver")
	attempts := append(byName["chat big"], byName["chat small-lan"]...)
	if len(attempts) != 2 {
		t.Fatalf("want two attempt spans (chat big, chat small-lan), got %d", len(attempts))
	}
	for _, s := range append([]*tracepb.Span{plan, deliver}, attempts...) {
		childOf(s, rt)
	}
	if got := attrString(auth, "molly.member"); got != "local" {
		t.Errorf("auth span member %q", got)
	}
	id := resp.Header.Get("X-Molly-Decision-Id")
	rev := attrString(pol, "molly.policy.revision")
	// Log lines are written off the request path (internal/asynclog).
	if attrString(pol, "molly.decision_id") != id || len(rev) != 64 || !g.waitLogs(regexp.MustCompile(`"revision":"`+regexp.QuoteMeta(rev)+`"`)) {
		t.Errorf("policy span: decision %q (header %q), revision %q (not in the decision log?)", attrString(pol, "molly.decision_id"), id, rev)
	}
	if attrString(plan, "molly.strategy") != "single" || attrString(cls, "molly.task") == "" {
		t.Errorf("plan strategy %q, classify task %q", attrString(plan, "molly.strategy"), attrString(cls, "molly.task"))
	}
	failed, ok := byName["chat big"][0], byName["chat small-lan"][0]
	if failed.Status.GetCode() != tracepb.Status_STATUS_CODE_ERROR || attrString(failed, "molly.failure") != "connect" || attrString(failed, "molly.tier") != "T2" {
		t.Errorf("failed attempt: status %v failure %q tier %q", failed.Status, attrString(failed, "molly.failure"), attrString(failed, "molly.tier"))
	}
	// upstreamtest reports 5 prompt and 5 completion tokens.
	for k, want := range map[string]string{"gen_ai.operation.name": "chat", "gen_ai.request.model": "small-lan", "molly.target": "lan",
		"molly.tier": "T1", "http.response.status_code": "200", "gen_ai.usage.input_tokens": "5", "gen_ai.usage.output_tokens": "5"} {
		if got := attrString(ok, k); got != want {
			t.Errorf("attempt span %s = %q, want %q", k, got, want)
		}
	}
	if ok.Kind != tracepb.Span_SPAN_KIND_CLIENT || ok.Status.GetCode() == tracepb.Status_STATUS_CODE_ERROR {
		t.Errorf("answering attempt: kind %v status %v", ok.Kind, ok.Status)
	}
	if got := attrString(rt, "molly.outcome"); got != "fallback" {
		t.Errorf("route span outcome %q, want fallback", got)
	}
	hs := lan.Headers()
	if len(hs) != 1 {
		t.Fatalf("lan got %d requests", len(hs))
	}
	want := "00-" + clientTrace + "-" + hex.EncodeToString(ok.SpanId) + "-01"
	if got := hs[0].Get("Traceparent"); got != want {
		t.Errorf("upstream traceparent %q, want the attempt's %q", got, want)
	}
}

// TestTracesTheEngineSteps: a request the T0 engine answers has the
// engine's steps as children of its attempt span — prefill (queue and
// prompt) then decode — carrying the token counts the answer's usage
// reports.
func TestTracesTheEngineSteps(t *testing.T) {
	rc := startOTLP(t)
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", rc.srv.URL)
	t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
	t.Setenv("OTEL_TRACES_EXPORTER", "otlp")
	t.Setenv("OTEL_BSP_SCHEDULE_DELAY", "100")
	models := t.TempDir()
	if err := serving.WriteDemo(models, 1, "tiny"); err != nil {
		t.Fatal(err)
	}
	g := startMolly(t, `{
	admin off
	auto_https off
	persist_config off
	molly {
		registry `+t.TempDir()+`/molly.db
		engine {
			model `+filepath.Join(models, serving.DemoModelFile)+`
			n_seq_max 1
			n_ctx 512
			threads 1
		}
		target device {
			tier T0
			kind engine
			models chat=molly-demo
		}
	}
}
http://127.0.0.1:{PORT} {
	tracing {
		span molly
	}
	molly_classify
	molly_policy
	molly_route
}
`)
	const clientTrace, clientSpan = "5bf92f3577b34da6a3ce929d0e0e4737", "10f067aa0ba902b8"
	params := chat("hello engine")
	params.MaxTokens = openai.Int(4)
	out, err := client(g).Chat.Completions.New(context.Background(), params,
		option.WithHeader("Traceparent", "00-"+clientTrace+"-"+clientSpan+"-01"))
	if err != nil {
		t.Fatal(err)
	}
	traceID, _ := hex.DecodeString(clientTrace)
	spans := rc.trace(t, traceID, "molly")
	byName := map[string][]*tracepb.Span{}
	var names []string
	for _, s := range spans {
		byName[s.Name] = append(byName[s.Name], s)
		names = append(names, s.Name)
	}
	attempt, prefill, decode := byName["chat molly-demo"], byName["molly.engine.prefill"], byName["molly.engine.decode"]
	if len(attempt) != 1 || len(prefill) != 1 || len(decode) != 1 {
		t.Fatalf("want one attempt, one prefill and one decode span; trace has %v", names)
	}
	for _, s := range []*tracepb.Span{prefill[0], decode[0]} {
		if string(s.ParentSpanId) != string(attempt[0].SpanId) {
			t.Errorf("span %q: parent %x, want the attempt %x", s.Name, s.ParentSpanId, attempt[0].SpanId)
		}
	}
	if prefill[0].EndTimeUnixNano > decode[0].StartTimeUnixNano {
		t.Errorf("prefill ends at %d, after decode starts at %d", prefill[0].EndTimeUnixNano, decode[0].StartTimeUnixNano)
	}
	if got, want := attrString(decode[0], "gen_ai.usage.output_tokens"), fmt.Sprint(out.Usage.CompletionTokens); got != want || want == "0" {
		t.Errorf("decode span output tokens %q, the answer's usage %q", got, want)
	}
	if got, want := attrString(decode[0], "gen_ai.usage.input_tokens"), fmt.Sprint(out.Usage.PromptTokens); got != want {
		t.Errorf("decode span input tokens %q, the answer's usage %q", got, want)
	}
	if got, want := attrString(prefill[0], "molly.engine.prompt_tokens"), fmt.Sprint(out.Usage.PromptTokens); got != want {
		t.Errorf("prefill span prompt tokens %q, the answer's usage %q", got, want)
	}
}
