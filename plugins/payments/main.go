// Command payments is Molly's payments tool, a go-plugin plugin (run by the
// gateway's plugin manager, never by hand): payment intents, captures and
// refunds, booked in a double-entry ledger in its own SQLite file, with
// idempotency keys so a retried call never charges twice. Side-effect class:
// money.
//
// Environment (granted by the tool's config; the host's is not inherited):
//
//	MOLLY_PAYMENTS_DB   path of the SQLite ledger file (required)
//
// Build: go build ./plugins/payments (or make build).
package main

import (
	"fmt"
	"os"

	"github.com/molly-gateway/molly/plugins"
)

func main() {
	path := os.Getenv("MOLLY_PAYMENTS_DB")
	if path == "" {
		fmt.Fprintln(os.Stderr, "payments: MOLLY_PAYMENTS_DB is not set; grant it in the tool's env config")
		os.Exit(1)
	}
	led, err := OpenLedger(path)
	if err != nil {
		fmt.Fprintln(os.Stderr, "payments:", err)
		os.Exit(1)
	}
	defer led.Close()
	plugins.Serve(&Tool{ledger: led, provider: LocalProvider{}})
}
