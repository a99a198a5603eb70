// Command support is Molly's customer-support tool, a go-plugin plugin (run
// by the gateway's plugin manager, never by hand): tickets with comments, a
// validated status lifecycle and an assignee, each optionally linked to the
// gateway conversation and decision it is about, in its own SQLite file.
// Every change needs an idempotency key, so a retried create opens one
// ticket. Side-effect class: write.
//
// Environment (granted by the tool's config; the host's is not inherited):
//
//	MOLLY_SUPPORT_DB   path of the SQLite ticket file (required)
//
// Build: go build ./plugins/support (or make build).
package main

import (
	"fmt"
	"os"

	"github.com/molly-gateway/molly/plugins"
)

func main() {
	path := os.Getenv("MOLLY_SUPPORT_DB")
	if path == "" {
		fmt.Fprintln(os.Stderr, "support: MOLLY_SUPPORT_DB is not set; grant it in the tool's env config")
		os.Exit(1)
	}
	st, err := OpenStore(path)
	if err != nil {
		fmt.Fprintln(os.Stderr, "support:", err)
		os.Exit(1)
	}
	defer st.Close()
	plugins.Serve(&Tool{store: st})
}
