package pipeline

import (
	"context"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/molly-gateway/molly/router/identity"
	"github.com/molly-gateway/molly/router/route"
)

// TestToolCallsAreSpans: each governed tool call is an execute_tool span
// under the caller's span (GenAI conventions' tool attributes), a denied
// one marked failed with its code; without a span in the context there
// are none.
func TestToolCallsAreSpans(t *testing.T) {
	_, p, _ := toolGateway(t, startTools(t), nil, nil, &route.Target{Name: "lan", Tier: "T1", Endpoint: "http://127.0.0.1:1/v1", Models: []string{"m"}})
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	ctx, parent := tp.Tracer("test").Start(context.Background(), "client")
	cls := testClassifier(t)
	alice := &identity.Identity{Member: "alice", Tools: []string{"support"}}
	if _, _, te := p.CallTool(ctx, cls, alice, "support", []byte(`{"op":"create","subject":"hello"}`), "k-1"); te != nil {
		t.Fatal(te)
	}
	if _, _, te := p.CallTool(ctx, cls, alice, "payments", []byte(`{"op":"balances"}`), "k-2"); te == nil {
		t.Fatal("payments is outside alice's scope")
	}
	if _, _, te := p.CallTool(context.Background(), cls, alice, "support", []byte(`{"op":"create","subject":"untraced"}`), "k-3"); te != nil {
		t.Fatal(te)
	}
	parent.End()
	spans := rec.Ended()
	if len(spans) != 3 { // two tool calls and the parent
		t.Fatalf("%d spans, want 3", len(spans))
	}
	for i, want := range []struct {
		name, tool, id string
		status         codes.Code
		errType        string
	}{{"execute_tool support", "support", "k-1", codes.Unset, ""}, {"execute_tool payments", "payments", "k-2", codes.Error, "permission_denied"}} {
		s := spans[i]
		attrs := map[attribute.Key]string{}
		for _, kv := range s.Attributes() {
			attrs[kv.Key] = kv.Value.Emit()
		}
		if s.Name() != want.name || s.Parent().SpanID() != parent.SpanContext().SpanID() || attrs["gen_ai.operation.name"] != "execute_tool" ||
			attrs["gen_ai.tool.name"] != want.tool || attrs["gen_ai.tool.call.id"] != want.id || attrs["molly.tier"] != DirectTier ||
			s.Status().Code != want.status || attrs["error.type"] != want.errType {
			t.Errorf("span %d: %s parent %s status %v attrs %v", i, s.Name(), s.Parent().SpanID(), s.Status(), attrs)
		}
	}
}
