// Command billing is Molly's billing tool, a go-plugin plugin (run by the
// gateway's plugin manager, never by hand): it records the gateway's usage
// events (member, model, tier, target, tokens, cost) in a ledger in its own
// SQLite file, idempotently by decision id, and answers invoice, balance and
// usage questions. Costs are integer nano-USD (1 USD = 10^9).
//
// Side-effect class: write. Describe carries one class per tool, so the
// class is that of the strongest operation (record_usage writes the ledger);
// the read operations (invoice, balance, usage) are told apart by policy
// through args.op. Billing never moves money: that is the payments tool.
//
// Environment (granted by the tool's config; the host's is not inherited):
//
//	MOLLY_BILLING_DB   path of the SQLite ledger file (required)
//
// Build: go build ./plugins/billing (or make build).
package main

import (
	"fmt"
	"os"

	"github.com/molly-gateway/molly/plugins"
)

func main() {
	path := os.Getenv("MOLLY_BILLING_DB")
	if path == "" {
		fmt.Fprintln(os.Stderr, "billing: MOLLY_BILLING_DB is not set; grant it in the tool's env config")
		os.Exit(1)
	}
	led, err := OpenLedger(path)
	if err != nil {
		fmt.Fprintln(os.Stderr, "billing:", err)
		os.Exit(1)
	}
	defer led.Close()
	plugins.Serve(&Tool{ledger: led})
}
