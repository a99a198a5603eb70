// Package policy is the Caddy handler http.handlers.molly_policy: it
// evaluates the molly app's Rego policy on the request annotation and either
// denies (403 with the reasons) or passes the decision on in the context. A
// client that went away before or while the policy ran gets no 403 but
// 499 client_closed, and is not billed: no upstream saw it.
package policy

import (
	"errors"
	"net/http"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/zap"

	"github.com/molly-gateway/molly/caddy-modules/app"
	"github.com/molly-gateway/molly/policies"
	"github.com/molly-gateway/molly/router/classify"
	"github.com/molly-gateway/molly/router/identity"
	"github.com/molly-gateway/molly/router/openai"
	"github.com/molly-gateway/molly/router/pipeline"
	"github.com/molly-gateway/molly/router/tracing"
)

// Policy is the molly_policy handler. It has no settings of its own: the
// policy lives in the molly app (policy_dir) and in Rego.
type Policy struct {
	app    *app.App
	logger *zap.Logger
}

func init() {
	caddy.RegisterModule(Policy{})
	httpcaddyfile.RegisterHandlerDirective("molly_policy", func(h httpcaddyfile.Helper) (caddyhttp.MiddlewareHandler, error) {
		p := new(Policy)
		return p, p.UnmarshalCaddyfile(h.Dispenser)
	})
}

// CaddyModule returns the Caddy module information.
func (Policy) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{ID: "http.handlers.molly_policy", New: func() caddy.Module { return new(Policy) }}
}

// Provision finds the molly app.
func (p *Policy) Provision(ctx caddy.Context) error {
	p.logger = ctx.Logger()
	var err error
	if p.app, err = app.Load(ctx, "molly_policy"); err != nil {
		return err
	}
	return nil
}

// UnmarshalCaddyfile parses "molly_policy" (no arguments).
func (p *Policy) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	return app.NoArgs(d, "molly_policy", "the policy is set by the global molly option (policy_dir) and Rego")
}

// ServeHTTP decides and calls next with the decision in the context.
func (p *Policy) ServeHTTP(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	openai.RequestID(w, r)
	ann := classify.From(r.Context())
	if ann == nil {
		return app.InternalError(w, r, p.logger, errors.New("molly_policy: no annotation; put molly_classify before molly_policy"))
	}
	if r.Context().Err() != nil {
		return p.clientGone(w, ann, "")
	}
	_, span := tracing.Start(r.Context(), "molly.policy", trace.SpanKindInternal)
	d := p.app.Pipeline().Decide(r.Context(), ann, identity.From(r.Context())) // nil identity without molly_auth: "anonymous"
	dec := d.Decision()
	endPolicy(span, dec)
	w.Header().Set(pipeline.HeaderDecisionID, dec.ID())
	if dec.Code() == policies.CodeClientClosed {
		// Not a denial: the client left while the policy ran.
		return p.clientGone(w, ann, dec.ID())
	}
	if !dec.Allowed() {
		p.app.Pipeline().Denied(ann, d, identity.From(r.Context())).Write(w)
		return nil
	}
	return next.ServeHTTP(w, r.WithContext(pipeline.WithDecided(r.Context(), d)))
}

// endPolicy ends the policy span with the decision: its id, revision,
// allow, code, class and tiers.
func endPolicy(span trace.Span, dec *policies.Decision) {
	if !span.IsRecording() {
		return
	}
	span.SetAttributes(tracing.DecisionID.String(dec.ID()), tracing.PolicyRevision.String(dec.Revision()),
		tracing.Allowed.Bool(dec.Allowed()), tracing.Sensitivity.String(dec.Sensitivity()), attribute.StringSlice("molly.policy.tiers", dec.Tiers()))
	if !dec.Allowed() {
		span.SetAttributes(tracing.DenyCode.String(dec.Code()))
		tracing.Fail(span, dec.Code(), "denied: "+dec.Code())
	}
	span.End()
}

// clientGone answers a client that went away before any upstream saw its
// request: nothing is billed, the log says so, and the request counts as
// client_closed (499, nginx's "client closed request"; nobody reads it).
func (p *Policy) clientGone(w http.ResponseWriter, ann *classify.Annotation, decisionID string) error {
	p.logger.Info("client went away before the policy decided", zap.String("decision_id", decisionID))
	p.app.Pipeline().Metrics.Unrouted(ann, "client_closed")
	w.WriteHeader(499)
	return nil
}

// Interface guards.
var (
	_ caddy.Provisioner           = (*Policy)(nil)
	_ caddyfile.Unmarshaler       = (*Policy)(nil)
	_ caddyhttp.MiddlewareHandler = (*Policy)(nil)
)
