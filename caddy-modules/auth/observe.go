package auth

import (
	"go.opentelemetry.io/otel/trace"

	"github.com/molly-gateway/molly/router/observe"
	"github.com/molly-gateway/molly/router/tracing"
)

// refused counts a request molly_auth refused and marks its span: reason
// "missing_key" or "invalid_key" (authentication failures), "budget" or
// "rate_<kind>" (refusals at admission).
func refused(span trace.Span, reason string) {
	switch reason {
	case "missing_key", "invalid_key":
		observe.DefaultMetrics.AuthFailure(reason)
	default:
		observe.DefaultMetrics.Refused(reason, "admission")
	}
	tracing.Fail(span, reason, "refused: "+reason)
	span.End()
}

// authenticated ends the auth span of a request admitted as member.
func authenticated(span trace.Span, member string) {
	span.SetAttributes(tracing.Member.String(member))
	span.End()
}
