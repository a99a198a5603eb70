package classify

import (
	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/dustin/go-humanize"

	"github.com/molly-gateway/molly/redaction"
	"github.com/molly-gateway/molly/router/classify"
)

func init() {
	httpcaddyfile.RegisterHandlerDirective("molly_classify", parseCaddyfile)
}

func parseCaddyfile(h httpcaddyfile.Helper) (caddyhttp.MiddlewareHandler, error) {
	c := new(Classify)
	return c, c.UnmarshalCaddyfile(h.Dispenser)
}

// UnmarshalCaddyfile parses:
//
//	molly_classify {
//		max_body_size <size>          # e.g. 8MiB
//		phone_region <ISO 3166 code>  # e.g. IT
//		entities <TYPE>...            # e.g. EMAIL PHONE CREDIT_CARD
//		sensitivity <TYPE> <class>    # e.g. EMAIL public
//		redact_mode <TYPE> placeholder|mask|hash
//		hash_key_env <VAR>            # HMAC key of hash mode, from the environment
//		pattern <TYPE> <regex>        # user-defined type, Go RE2; repeatable
//		dictionary <TYPE> <word>...   # user-defined type, whole words, any case
//		body_timeout <duration>|off   # the whole body within this (default 60s), else 408
//		min_body_rate <size> [<grace>]|off  # bytes per second after grace (default 240B 5s), else 408
//	}
func (c *Classify) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // directive name
	if d.NextArg() {
		return d.Errf("molly_classify: unexpected argument %q; settings go in a block", d.Val())
	}
	for d.NextBlock(0) {
		switch d.Val() {
		case "max_body_size":
			var s string
			if !d.AllArgs(&s) {
				return d.ArgErr()
			}
			n, err := humanize.ParseBytes(s)
			if err != nil || n == 0 {
				return d.Errf("molly_classify: max_body_size %q is not a size such as 8MiB", s)
			}
			c.MaxBodyBytes = int64(n)
		case "phone_region":
			if !d.AllArgs(&c.PhoneRegion) {
				return d.ArgErr()
			}
		case "entities":
			c.Entities = append(c.Entities, d.RemainingArgs()...)
			if len(c.Entities) == 0 {
				return d.ArgErr()
			}
		case "sensitivity":
			var typ, class string
			if !d.AllArgs(&typ, &class) {
				return d.Err("molly_classify: sensitivity takes <ENTITY_TYPE> <public|internal|confidential|restricted>")
			}
			if _, err := classify.ParseSensitivity(class); err != nil {
				return d.Errf("molly_classify: sensitivity %s: %v", typ, err)
			}
			if c.Sensitivity == nil {
				c.Sensitivity = map[string]string{}
			}
			c.Sensitivity[typ] = class
		case "redact_mode":
			var typ, mode string
			if !d.AllArgs(&typ, &mode) {
				return d.Err("molly_classify: redact_mode takes <ENTITY_TYPE> <placeholder|mask|hash>")
			}
			if _, err := redaction.ParseMode(mode); err != nil {
				return d.Errf("molly_classify: redact_mode %s: %v", typ, err)
			}
			if c.RedactModes == nil {
				c.RedactModes = map[string]string{}
			}
			c.RedactModes[typ] = mode
		case "hash_key_env":
			if !d.AllArgs(&c.HashKeyEnv) {
				return d.Err("molly_classify: hash_key_env takes the name of an environment variable")
			}
		case "pattern":
			var typ, expr string
			if !d.AllArgs(&typ, &expr) {
				return d.Err("molly_classify: pattern takes <TYPE> <regex> (quote a regex with spaces, or use backticks)")
			}
			if c.Patterns == nil {
				c.Patterns = map[string][]string{}
			}
			c.Patterns[typ] = append(c.Patterns[typ], expr)
		case "dictionary":
			args := d.RemainingArgs()
			if len(args) < 2 {
				return d.Err("molly_classify: dictionary takes <TYPE> <word>...")
			}
			if c.Dictionaries == nil {
				c.Dictionaries = map[string][]string{}
			}
			c.Dictionaries[args[0]] = append(c.Dictionaries[args[0]], args[1:]...)
		case "body_timeout":
			var v string
			if !d.AllArgs(&v) {
				return d.ArgErr()
			}
			if v == "off" {
				c.BodyTimeout = -1
				break
			}
			dur, err := caddy.ParseDuration(v)
			if err != nil || dur <= 0 {
				return d.Errf("molly_classify: body_timeout %q is not a duration such as 60s (or off)", v)
			}
			c.BodyTimeout = caddy.Duration(dur)
		case "min_body_rate":
			args := d.RemainingArgs()
			if len(args) == 1 && args[0] == "off" {
				c.MinBodyRate = -1
				break
			}
			if len(args) < 1 || len(args) > 2 {
				return d.Err("molly_classify: min_body_rate takes <bytes per second> [<grace period>], e.g. 240B 5s, or off")
			}
			n, err := humanize.ParseBytes(args[0])
			if err != nil || n == 0 {
				return d.Errf("molly_classify: min_body_rate %q is not a size per second such as 240B or 1KiB", args[0])
			}
			c.MinBodyRate = int64(n)
			if len(args) == 2 {
				dur, err := caddy.ParseDuration(args[1])
				if err != nil || dur < 0 {
					return d.Errf("molly_classify: min_body_rate grace %q is not a duration such as 5s", args[1])
				}
				c.MinBodyRateGrace = caddy.Duration(dur)
			}
		default:
			return d.Errf("molly_classify: unrecognized subdirective %q", d.Val())
		}
	}
	return nil
}

// Interface guard.
var _ caddyfile.Unmarshaler = (*Classify)(nil)
