package feedback

import (
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

func init() {
	httpcaddyfile.RegisterHandlerDirective("molly_feedback", func(h httpcaddyfile.Helper) (caddyhttp.MiddlewareHandler, error) {
		f := new(Feedback)
		return f, f.UnmarshalCaddyfile(h.Dispenser)
	})
}

// UnmarshalCaddyfile parses "molly_feedback" (no arguments). The directive
// order is registered by the molly app (after molly_route); use it inside
// its own `handle /v1/feedback { ... }` block.
func (f *Feedback) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next()
	if d.NextArg() || d.NextBlock(0) {
		return d.Errf("molly_feedback: takes no arguments; priors live in the registry of the global molly option (registry)")
	}
	return nil
}
