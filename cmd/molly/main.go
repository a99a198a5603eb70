// Command molly is Molly, the sovereign inference gateway: a Caddy build
// with Molly's modules. `molly run --config Caddyfile`, `molly validate`,
// `molly adapt` and `molly reload` behave as in Caddy, except that the
// admin endpoint defaults to a Unix socket only its user can open and a
// plaintext TCP one is refused (caddy-modules/admin); `molly keys`,
// `molly adapters` and `molly targets` talk to it. `molly version` prints
// Molly's version followed by Caddy's.
package main

import (
	"encoding/json"
	"fmt"
	"os"
	"runtime/debug"
	"strings"

	"github.com/caddyserver/caddy/v2"
	caddycmd "github.com/caddyserver/caddy/v2/cmd"

	_ "github.com/caddyserver/caddy/v2/modules/standard"

	_ "github.com/molly-gateway/molly/caddy-modules/accesslog"
	"github.com/molly-gateway/molly/caddy-modules/admin"
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

// longDescription is what `molly help` prints above the commands.
const longDescription = `Molly is a sovereign inference gateway: an OpenAI-compatible proxy that
classifies each request, asks its policy which tiers (the on-device
engine, the LAN, self-hosted and external APIs) may serve it, redacts
what must not leave and restores it in the answer. It is a Caddy build
with Molly's modules.

To run Molly, use:

	- 'molly run --config Caddyfile' to run it in the foreground.
	- 'molly reload --config Caddyfile' to apply a changed config.
	- 'molly keys', 'molly adapters' and 'molly targets' to manage a
	  running Molly through its admin socket.
`

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

// defaultGCPercent is the GOGC molly runs with when the environment sets
// none. The gateway's live heap is small (about 25 MB without a T0 model;
// the model's weights are C memory) while every request leaves tens of KB
// of garbage, so at Go's default of 100 it collects every ~100 ms under
// load, and the requests that meet a collection make the tail (the 99th
// percentile of a 2 KB request at concurrency 1 rose from about 200 to
// about 550 µs over bare Caddy in make bench). 400 lets the heap grow to
// five times the live data between collections; the memory limit Caddy
// sets from the cgroup or the machine (GOMEMLIMIT, 90%) still makes the
// collector work harder when memory runs short. GOGC=100 restores Go's
// default.
const defaultGCPercent = 400

// tuneGC applies defaultGCPercent unless GOGC is set; restore puts back
// the previous setting.
func tuneGC() (restore func()) {
	if _, set := os.LookupEnv("GOGC"); set {
		return func() {}
	}
	old := debug.SetGCPercent(defaultGCPercent)
	return func() { debug.SetGCPercent(old) }
}

func main() {
	tuneGC()
	// Caddy prints CustomVersion before its own version in `version` (and
	// its logs): "Molly v1.2.3; Caddy v2.11.9 h1:…".
	caddy.CustomVersion = "Molly " + Version() + "; Caddy"
	// Help and usage lines name the binary ("Usage: molly keys …").
	caddy.CustomBinaryName = "molly"
	caddy.CustomLongDescription = longDescription
	if err := checkAdminCommand(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "Error:", err)
		os.Exit(1)
	}
	if err := checkValidateCommand(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "Error:", err)
		os.Exit(1)
	}
	caddycmd.Main()
}

// checkAdminCommand refuses `molly reload` and `molly stop` when the admin
// address they would use (--address, else --config's admin setting, as
// Caddy resolves it) is not a Unix socket: a running Molly never listens
// on plaintext TCP, so whatever answers there is not it, and a config must
// not be sent to it. Other commands pass.
func checkAdminCommand(args []string) error {
	if len(args) == 0 || (args[0] != "reload" && args[0] != "stop") {
		return nil
	}
	flags := commandFlags(args)
	addr, err := caddycmd.DetermineAdminAPIAddress(flags["address"], nil, flags["config"], flags["adapter"])
	if err != nil {
		return nil // Caddy's command reports it
	}
	na, err := caddy.ParseNetworkAddress(addr)
	if err != nil || na.IsUnixNetwork() {
		return nil
	}
	return fmt.Errorf("molly %s: the admin address %s is not a Unix socket. Molly's admin endpoint never listens on plaintext TCP (a config asking for it is refused), "+
		"so what answers there is not a Molly; use its socket (no admin address in the config, or admin unix//path/to/admin.sock, or --address unix//path)", args[0], addr)
}

// commandFlags reads --config (-c), --adapter (-a) and --address from a
// command's arguments (args[0] is the command), as Caddy's flags take them.
func commandFlags(args []string) map[string]string {
	flags := map[string]string{}
	for i := 1; i < len(args); i++ {
		a := args[i]
		for _, name := range []string{"config", "adapter", "address"} {
			short := map[string]string{"config": "-c", "adapter": "-a"}[name]
			switch {
			case strings.HasPrefix(a, "--"+name+"="):
				flags[name] = strings.TrimPrefix(a, "--"+name+"=")
			case (a == "--"+name || (short != "" && a == short)) && i+1 < len(args):
				flags[name] = args[i+1]
			}
		}
	}
	return flags
}

// checkValidateCommand makes `molly validate` refuse what `molly run`
// refuses when its admin endpoint starts (admin.Check): an admin block
// that would listen on plaintext TCP or on a socket others may use
// (admin.Validate). Validation provisions only the config's apps, so the
// molly app checks the admin block there when the config has one; a
// config with no Molly module (plain Caddy sites) is checked here. The
// config is the one `validate` reads (--config, else ./Caddyfile, with
// --adapter); one that cannot be read or decoded is left to Caddy's
// command to report. Other commands pass.
func checkValidateCommand(args []string) error {
	if len(args) == 0 || args[0] != "validate" {
		return nil
	}
	flags := commandFlags(args)
	file := flags["config"]
	if file == "" {
		if _, err := os.Stat("Caddyfile"); err != nil {
			return nil
		}
		file = "Caddyfile"
	}
	body, _, _, err := caddycmd.LoadConfig(file, flags["adapter"])
	if err != nil {
		return nil
	}
	var cfg struct {
		Admin *caddy.AdminConfig `json:"admin"`
	}
	if json.Unmarshal(body, &cfg) != nil {
		return nil
	}
	if err := admin.Validate(cfg.Admin); err != nil {
		return fmt.Errorf("molly validate: %w", err)
	}
	return nil
}
