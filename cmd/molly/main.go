// Command molly is Molly, the sovereign inference gateway: a Caddy build
// with Molly's modules. `molly run --config Caddyfile`, `molly validate`,
// `molly adapt` and `molly reload` behave as in Caddy, except that the
// admin endpoint defaults to a Unix socket only its user can open and a
// plaintext TCP one is refused (caddy-modules/admin); `molly keys`,
// `molly adapters` and `molly targets` talk to it. `molly version` prints
// Molly's version followed by Caddy's.
package main

import (
	"runtime/debug"

	"github.com/caddyserver/caddy/v2"
	caddycmd "github.com/caddyserver/caddy/v2/cmd"

	_ "github.com/caddyserver/caddy/v2/modules/standard"

	_ "github.com/molly-gateway/molly/caddy-modules/accesslog"
	_ "github.com/molly-gateway/molly/caddy-modules/admin"
	_ "github.com/molly-gateway/molly/caddy-modules/app"
	_ "github.com/molly-gateway/molly/caddy-modules/auth"
	_ "github.com/molly-gateway/molly/caddy-modules/classify"
	_ "github.com/molly-gateway/molly/caddy-modules/console"
	_ "github.com/molly-gateway/molly/caddy-modules/envoy"
	_ "github.com/molly-gateway/molly/caddy-modules/federation"
	_ "github.com/molly-gateway/molly/caddy-modules/feedback"
	_ "github.com/molly-gateway/molly/caddy-modules/health"
	_ "github.com/molly-gateway/molly/caddy-modules/policy"
	_ "github.com/molly-gateway/molly/caddy-modules/route"
	_ "github.com/molly-gateway/molly/caddy-modules/serve"
)

// version is Molly's version, set at build time by the Makefile
// (-ldflags "-X main.version=<git describe>"); empty: the module's version
// from the build information, else "devel".
var version string

// Version is Molly's version.
func Version() string {
	if version != "" {
		return version
	}
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		return bi.Main.Version
	}
	return "devel"
}

func main() {
	// Caddy prints CustomVersion before its own version in `version` (and
	// its logs): "Molly v1.2.3; Caddy v2.11.9 h1:…".
	caddy.CustomVersion = "Molly " + Version() + "; Caddy"
	caddycmd.Main()
}
