package auth

import (
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

// The directive's order (before molly_classify) is registered with the
// other molly directives in caddy-modules/app.
func init() {
	httpcaddyfile.RegisterHandlerDirective("molly_auth", func(h httpcaddyfile.Helper) (caddyhttp.MiddlewareHandler, error) {
		au := new(Auth)
		return au, au.UnmarshalCaddyfile(h.Dispenser)
	})
}

// UnmarshalCaddyfile parses:
//
//	molly_auth {
//		db <path>            # registry file; default molly/molly.db in Caddy's data dir
//		anonymous <member>   # serve requests without a Molly key as this member
//	}
func (au *Auth) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // directive name
	if d.NextArg() {
		return d.Errf("molly_auth: unexpected argument %q; settings go in a block", d.Val())
	}
	for d.NextBlock(0) {
		switch d.Val() {
		case "db":
			if !d.AllArgs(&au.DB) {
				return d.Err("molly_auth: db takes one path")
			}
		case "anonymous":
			if !d.AllArgs(&au.Anonymous) {
				return d.Err("molly_auth: anonymous takes one member name")
			}
		default:
			return d.Errf("molly_auth: unrecognized subdirective %q", d.Val())
		}
	}
	return nil
}

// Interface guard.
var _ caddyfile.Unmarshaler = (*Auth)(nil)
