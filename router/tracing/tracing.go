// Package tracing makes Molly's OpenTelemetry spans: one trace per request,
// under the server span of Caddy's tracing handler (the `tracing`
// directive), with a child span per stage (auth, classify, policy, plan),
// per upstream attempt, per delivery and per governed tool call.
//
// Spans are made with the tracer provider of the span already in the
// context, so they go to the exporter Caddy's tracing module configured
// (from the OTEL_* environment variables, as Caddy documents it) and the
// server span is their parent. Without a span in the context — no
// `tracing` directive on the site — every span is OpenTelemetry's no-op
// span and costs a context lookup.
//
// Attributes follow the OpenTelemetry semantic conventions for generative
// AI client spans (https://opentelemetry.io/docs/specs/semconv/gen-ai/gen-ai-spans/):
// an attempt span is named "{gen_ai.operation.name} {gen_ai.request.model}",
// of kind client, with gen_ai.operation.name, gen_ai.request.model,
// gen_ai.response.model, gen_ai.usage.input_tokens and
// gen_ai.usage.output_tokens; a tool call is "execute_tool {gen_ai.tool.name}".
// Molly's own attributes are under molly.*. No span carries request or
// answer text.
package tracing

import (
	"context"
	"net/http"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// Scope is the instrumentation scope name of Molly's spans.
const Scope = "github.com/molly-gateway/molly"

// Attribute keys. The gen_ai.* keys are the GenAI semantic conventions';
// the rest are Molly's.
const (
	GenAIOperationName   = attribute.Key("gen_ai.operation.name")
	GenAIRequestModel    = attribute.Key("gen_ai.request.model")
	GenAIResponseModel   = attribute.Key("gen_ai.response.model")
	GenAIRequestMaxToken = attribute.Key("gen_ai.request.max_tokens")
	GenAIUsageInput      = attribute.Key("gen_ai.usage.input_tokens")
	GenAIUsageOutput     = attribute.Key("gen_ai.usage.output_tokens")
	GenAIToolName        = attribute.Key("gen_ai.tool.name")
	GenAIToolCallID      = attribute.Key("gen_ai.tool.call.id")
	HTTPStatusCode       = attribute.Key("http.response.status_code")
	ErrorType            = attribute.Key("error.type")

	Member         = attribute.Key("molly.member")
	DecisionID     = attribute.Key("molly.decision_id")
	PolicyRevision = attribute.Key("molly.policy.revision")
	Allowed        = attribute.Key("molly.policy.allow")
	DenyCode       = attribute.Key("molly.policy.code")
	Sensitivity    = attribute.Key("molly.sensitivity")
	Task           = attribute.Key("molly.task")
	Findings       = attribute.Key("molly.findings")
	Strategy       = attribute.Key("molly.strategy")
	Candidates     = attribute.Key("molly.candidates")
	Target         = attribute.Key("molly.target")
	Tier           = attribute.Key("molly.tier")
	Adapter        = attribute.Key("molly.adapter")
	Failure        = attribute.Key("molly.failure")
	Redacted       = attribute.Key("molly.redacted")
	Outcome        = attribute.Key("molly.outcome")
	CostUSD        = attribute.Key("molly.cost_usd")
)

// Enabled reports whether ctx carries a trace to add spans to; callers
// building many attributes check it first, so that an untraced request
// allocates none.
func Enabled(ctx context.Context) bool { return trace.SpanContextFromContext(ctx).IsValid() }

// Start starts a span named name under the span in ctx, with the tracer
// provider that span came from. The span is a no-op when ctx has none.
func Start(ctx context.Context, name string, kind trace.SpanKind, attrs ...attribute.KeyValue) (context.Context, trace.Span) {
	parent := trace.SpanFromContext(ctx)
	if !parent.SpanContext().IsValid() {
		return ctx, parent // no trace: nothing to add to (the no-op span)
	}
	return parent.TracerProvider().Tracer(Scope).Start(ctx, name, trace.WithSpanKind(kind), trace.WithAttributes(attrs...))
}

// Fail marks span as failed with the error type kind and a description
// (which must carry no request or answer text).
func Fail(span trace.Span, kind, description string) {
	span.SetAttributes(ErrorType.String(kind))
	span.SetStatus(codes.Error, description)
}

// propagator writes W3C trace context (https://www.w3.org/TR/trace-context/).
var propagator = propagation.TraceContext{}

// Header returns the headers to forward upstream for a call made under
// ctx: hdr itself when ctx carries no recording span, else a copy whose
// traceparent and tracestate name the span of ctx, so the upstream's
// spans become children of that attempt.
func Header(ctx context.Context, hdr http.Header) http.Header {
	sc := trace.SpanContextFromContext(ctx)
	if !sc.IsValid() {
		return hdr
	}
	out := hdr.Clone()
	if out == nil {
		out = http.Header{}
	}
	out.Del("Traceparent")
	out.Del("Tracestate")
	propagator.Inject(ctx, propagation.HeaderCarrier(out))
	return out
}
