// Command molly is Molly, the sovereign inference gateway: a Caddy build
// with Molly's modules. `molly run --config Caddyfile`, `molly validate`,
// `molly adapt` and `molly reload` behave as in Caddy, except that the
// admin endpoint defaults to a Unix socket only its user can open and a
// plaintext TCP one is refused (caddy-modules/admin); `molly keys`,
// `molly adapters` and `molly targets` talk to it.
package main

import (
	caddycmd "github.com/caddyserver/caddy/v2/cmd"

	_ "github.com/caddyserver/caddy/v2/modules/standard"

	_ "github.com/molly-gateway/molly/caddy-modules/accesslog"
	_ "github.com/molly-gateway/molly/caddy-modules/admin"
	_ "github.com/molly-gateway/molly/caddy-modules/app"
	_ "github.com/molly-gateway/molly/caddy-modules/auth"
	_ "github.com/molly-gateway/molly/caddy-modules/classify"
	_ "github.com/molly-gateway/molly/caddy-modules/feedback"
	_ "github.com/molly-gateway/molly/caddy-modules/policy"
	_ "github.com/molly-gateway/molly/caddy-modules/route"
	_ "github.com/molly-gateway/molly/caddy-modules/serve"
)

func main() {
	caddycmd.Main()
}
