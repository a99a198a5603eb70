package app

import (
	"fmt"
	"net/http"
	"os"
	"text/tabwriter"
	"time"

	caddycmd "github.com/caddyserver/caddy/v2/cmd"
	"github.com/spf13/cobra"

	"github.com/molly-gateway/molly/caddy-modules/admin"
)

// The `molly targets` command prints the targets of a running Molly with
// their circuits (GET /molly/targets), at the address admin.Flags
// resolves (Molly's socket by default).
func init() {
	caddycmd.RegisterCommand(caddycmd.Command{
		Name:  "targets",
		Short: "Lists the targets of a running Molly with their health (circuit state, failures, ejections)",
		CobraFunc: func(cmd *cobra.Command) {
			admin.Flags(cmd)
			cmd.Args = cobra.NoArgs
			cmd.RunE = func(c *cobra.Command, _ []string) error {
				var ts []targetStatus
				if err := admin.Call(c, http.MethodGet, "/molly/targets", nil, &ts); err != nil {
					return err
				}
				tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
				fmt.Fprintln(tw, "TARGET\tTIER\tSTATE\tFAILURES IN A ROW\tEJECTIONS\tUNTIL\tREASON")
				for _, t := range ts {
					until := "-"
					if t.State != "closed" && !t.Until.IsZero() {
						until = t.Until.Format(time.RFC3339)
					}
					state, reason := t.State, t.Reason
					if t.Excluded != "" { // never routed to, whatever its circuit
						state, reason = "excluded", t.Excluded
					}
					fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%s\t%s\n", t.Target, t.Tier, state, t.ConsecutiveFailures, t.Ejections, until, reason)
				}
				return tw.Flush()
			}
		},
	})
}
