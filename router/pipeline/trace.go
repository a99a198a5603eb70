package pipeline

import (
	"context"
	"strings"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/molly-gateway/molly/router/route"
	"github.com/molly-gateway/molly/router/tracing"
)

// Spans of a routed request (package tracing): "molly.route" under the
// policy step's caller, with "molly.plan", one "{operation} {model}" client
// span per attempt, "molly.deliver" and "execute_tool {name}" below it.

// traceRoute starts the request's route span (rq.ctx carries it from
// here on) and returns what ends it, with the outcome's label and status.
func traceRoute(rq *request) func() {
	if !tracing.Enabled(rq.ctx) {
		return func() {}
	}
	ctx, span := tracing.Start(rq.ctx, "molly.route", trace.SpanKindInternal,
		tracing.DecisionID.String(rq.dec.ID()), tracing.PolicyRevision.String(rq.dec.Revision()),
		tracing.GenAIOperationName.String(rq.a.Endpoint().Operation()), tracing.GenAIRequestModel.String(rq.a.Model()))
	if !span.IsRecording() {
		return func() {}
	}
	rq.ctx = ctx
	return func() {
		out := &rq.outcome
		span.SetAttributes(tracing.Outcome.String(out.Label), tracing.HTTPStatusCode.Int(out.Status), tracing.Member.String(out.Member))
		if out.Answered >= 0 && out.Answered < len(out.Attempts) {
			a := out.Attempts[out.Answered]
			span.SetAttributes(tracing.Target.String(a.Target), tracing.Tier.String(a.Tier))
		}
		if out.Status >= 500 || out.Label == "failed" {
			tracing.Fail(span, out.Label, "no answer: "+out.Label)
		}
		span.End()
	}
}

// tracePlan records the planning step that started at begin.
func tracePlan(rq *request, begin time.Time) {
	sp := trace.SpanFromContext(rq.ctx)
	if !sp.IsRecording() {
		return
	}
	cands := make([]string, len(rq.plan.Candidates))
	for i, c := range rq.plan.Candidates {
		cands[i] = c.Label()
	}
	_, span := sp.TracerProvider().Tracer(tracing.Scope).Start(rq.ctx, "molly.plan", trace.WithTimestamp(begin),
		trace.WithAttributes(tracing.Strategy.String(string(rq.plan.Strategy)), tracing.Candidates.StringSlice(cands),
			attribute.StringSlice("molly.plan.reasons", rq.plan.Reasons), attribute.Int("molly.plan.excluded", len(rq.plan.Excluded)),
			attribute.Int("molly.plan.reserve_tokens", rq.plan.Reserve.Tokens), attribute.Float64("molly.plan.reserve_usd", rq.plan.Reserve.CostUSD)))
	span.End()
}

// startAttempt starts the client span of one attempt at c; its context is
// the one the call is sent with, so the forwarded traceparent names it.
func startAttempt(rq *request, c route.Candidate) (context.Context, trace.Span) {
	if !tracing.Enabled(rq.ctx) {
		return rq.ctx, trace.SpanFromContext(rq.ctx) // the no-op span
	}
	op := rq.a.Endpoint().Operation()
	return tracing.Start(rq.ctx, op+" "+c.Model, trace.SpanKindClient,
		tracing.GenAIOperationName.String(op), tracing.GenAIRequestModel.String(c.Model),
		tracing.Target.String(c.Target.Name), tracing.Tier.String(c.Target.Tier), tracing.Adapter.String(c.Adapter()))
}

// endAttempt ends an attempt's span with what it came to.
func endAttempt(span trace.Span, o *outcome) {
	if !span.IsRecording() {
		return
	}
	if o.status != 0 {
		span.SetAttributes(tracing.HTTPStatusCode.Int(o.status))
	}
	if o.disp != nil {
		span.SetAttributes(tracing.Redacted.Int(o.disp.Redacted()))
	}
	if u := o.usage(); u != nil {
		span.SetAttributes(tracing.GenAIUsageInput.Int(u.PromptTokens), tracing.GenAIUsageOutput.Int(u.CompletionTokens), tracing.CostUSD.Float64(u.CostUSD))
	}
	if !o.ok() {
		span.SetAttributes(tracing.Failure.String(string(o.kind)))
		tracing.Fail(span, string(o.kind), "attempt failed: "+string(o.kind)) // o.failure may quote the upstream
	}
	span.End()
}

// startDeliver starts the span of writing o's answer to the client; the
// returned func ends it with the tokens metered by then.
func startDeliver(rq *request, o *outcome) func() {
	if !tracing.Enabled(rq.ctx) {
		return func() {}
	}
	_, span := tracing.Start(rq.ctx, "molly.deliver", trace.SpanKindInternal,
		tracing.Target.String(o.cand.Target.Name), tracing.Tier.String(o.cand.Target.Tier),
		attribute.Bool("molly.stream", o.stream != nil))
	if !span.IsRecording() {
		return func() {}
	}
	return func() {
		span.SetAttributes(tracing.Outcome.String(rq.outcome.Label))
		if u := o.usage(); u != nil {
			span.SetAttributes(tracing.GenAIUsageInput.Int(u.PromptTokens), tracing.GenAIUsageOutput.Int(u.CompletionTokens))
		}
		if l := rq.outcome.Label; l == "truncated" || l == "output_blocked" || l == "upstream_error" {
			tracing.Fail(span, l, strings.ReplaceAll(l, "_", " "))
		}
		span.End()
	}
}

// startTool starts the span of one governed tool call.
func startTool(ctx context.Context, name, callID, target, tier string) (context.Context, trace.Span) {
	if !tracing.Enabled(ctx) {
		return ctx, trace.SpanFromContext(ctx)
	}
	return tracing.Start(ctx, "execute_tool "+name, trace.SpanKindInternal,
		tracing.GenAIOperationName.String("execute_tool"), tracing.GenAIToolName.String(name), tracing.GenAIToolCallID.String(callID),
		tracing.Target.String(target), tracing.Tier.String(tier))
}

// endTool ends a tool call's span; te is the call's error, nil on success.
func endTool(span trace.Span, te *ToolError) {
	if te != nil {
		tracing.Fail(span, te.Code, "tool call failed: "+te.Code) // the message may quote the tool
	}
	span.End()
}
