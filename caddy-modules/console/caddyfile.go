package console

import (
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

func init() {
	httpcaddyfile.RegisterHandlerDirective("molly_console", func(h httpcaddyfile.Helper) (caddyhttp.MiddlewareHandler, error) {
		c := new(Console)
		return c, c.UnmarshalCaddyfile(h.Dispenser)
	})
	httpcaddyfile.RegisterDirectiveOrder("molly_console", httpcaddyfile.Before, "reverse_proxy")
}

// UnmarshalCaddyfile parses
//
//	molly_console {
//		members <member>...
//	}
//
// usually inside `handle /console*`.
func (c *Console) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // "molly_console"
	if d.NextArg() {
		return d.ArgErr()
	}
	for d.NextBlock(0) {
		switch d.Val() {
		case "members":
			args := d.RemainingArgs()
			if len(args) == 0 {
				return d.ArgErr()
			}
			c.Members = append(c.Members, args...)
		default:
			return d.Errf("molly_console: unrecognized subdirective %q", d.Val())
		}
	}
	if len(c.Members) == 0 {
		return d.Err("molly_console: members <member>... is required: the registry members whose API keys may read the console")
	}
	return nil
}

var _ caddyfile.Unmarshaler = (*Console)(nil)
