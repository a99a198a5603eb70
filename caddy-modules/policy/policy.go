// Package policy is the Caddy handler http.handlers.molly_policy: it
// evaluates the molly app's Rego policy on the request annotation and either
// denies (403 with the reasons) or passes the decision on in the context.
package policy

import (
	"fmt"
	"net/http"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

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
	app *app.App
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
		return caddyhttp.Error(http.StatusInternalServerError, fmt.Errorf("molly_policy: no annotation; put molly_classify before molly_policy"))
	}
	_, span := tracing.Start(r.Context(), "molly.policy", trace.SpanKindInternal)
	d := p.app.Pipeline().Decide(r.Context(), ann, identity.From(r.Context())) // nil identity without molly_auth: "anonymous"
	dec := d.Decision()
	endPolicy(span, dec)
	w.Header().Set(pipeline.HeaderDecisionID, dec.ID())
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

// Interface guards.
var (
	_ caddy.Provisioner           = (*Policy)(nil)
	_ caddyfile.Unmarshaler       = (*Policy)(nil)
	_ caddyhttp.MiddlewareHandler = (*Policy)(nil)
)
