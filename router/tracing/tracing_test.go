package tracing

import (
	"context"
	"net/http"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
)

// TestSpansFollowTheContext: without a span in the context Start records
// nothing and Header forwards the client's headers unchanged; under a span,
// Start's span is its child (same provider) and Header names that child
// in a W3C traceparent, leaving the client's headers untouched.
func TestSpansFollowTheContext(t *testing.T) {
	client := http.Header{"Traceparent": {"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}, "X-Request-Id": {"r1"}}
	ctx, span := Start(context.Background(), "molly.plan", trace.SpanKindInternal)
	if span.IsRecording() || span.SpanContext().IsValid() {
		t.Fatal("a span without a trace")
	}
	if got := Header(ctx, client); got.Get("Traceparent") != client.Get("Traceparent") {
		t.Fatalf("without a span: %v", got)
	}

	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	ctx, server := tp.Tracer("caddy").Start(context.Background(), "server")
	ctx, attempt := Start(ctx, "chat m", trace.SpanKindClient, Tier.String("T1"))
	h := Header(ctx, client)
	attempt.End()
	server.End()
	sc := attempt.SpanContext()
	if want := "00-" + sc.TraceID().String() + "-" + sc.SpanID().String() + "-01"; h.Get("Traceparent") != want || h.Get("X-Request-Id") != "r1" {
		t.Fatalf("forwarded %v, want traceparent %s", h, want)
	}
	if client.Get("Traceparent") != "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01" {
		t.Fatal("the client's headers were changed")
	}
	ended := rec.Ended()
	if len(ended) != 2 || ended[0].Name() != "chat m" || ended[0].Parent().SpanID() != server.SpanContext().SpanID() || ended[0].SpanKind() != trace.SpanKindClient {
		t.Fatalf("spans %v", ended)
	}
}
