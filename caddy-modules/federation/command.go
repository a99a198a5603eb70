// Package federation registers `molly federation`, the command line of
// federated adapter improvement (learning/federation): `run --once` and
// `status` talk to a running Molly through admin.api.molly_federation;
// `status --state <file>` reads a participant's state file offline.
package federation

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"text/tabwriter"

	caddycmd "github.com/caddyserver/caddy/v2/cmd"
	"github.com/spf13/cobra"

	"github.com/molly-gateway/molly/caddy-modules/admin"
	"github.com/molly-gateway/molly/caddy-modules/app"
	"github.com/molly-gateway/molly/learning/adapters"
	"github.com/molly-gateway/molly/learning/federation"
)

func init() {
	caddycmd.RegisterCommand(caddycmd.Command{
		Name:  "federation",
		Short: "Federated adapter improvement (molly federation run --once | status)",
		CobraFunc: func(cmd *cobra.Command) {
			admin.Flags(cmd)
			run := &cobra.Command{
				Use:   "run --once [--domain d]...",
				Short: "Contributes each domain's adapter delta, waits for the round, adopts the aggregate through the gate",
				Long: `Asks the running Molly (a federation participant) to send, per domain, the delta of its
latest locally trained adapter version to the aggregator, wait for the round to close, pull
the aggregate and evaluate it on its own held-out pairs: the aggregate becomes an adapter
version of source "federated", promoted or refused by the same gate as a local one.
Prints one JSON entry per domain.`,
				Args: cobra.NoArgs,
				RunE: func(c *cobra.Command, _ []string) error {
					if once, _ := c.Flags().GetBool("once"); !once {
						return errors.New("pass --once: after each specialisation cycle Molly contributes on its own")
					}
					domains, _ := c.Flags().GetStringArray("domain")
					var out []app.FederatedDomain
					if err := admin.Call(c, http.MethodPost, "/molly/federation/run", app.FederationRunRequest{Domains: domains}, &out); err != nil {
						return err
					}
					return printJSON(os.Stdout, out)
				},
			}
			run.Flags().Bool("once", false, "run once and exit")
			run.Flags().StringArray("domain", nil, "a domain to federate (repeatable; default: every domain with a local adapter)")
			status := &cobra.Command{
				Use:   "status [--state <file>] [--json]",
				Short: "Shows the privacy budget spent (ε at δ), the deltas sent and the last runs",
				Long: `Asks the running Molly for its federation status: its role, and for a participant the
(ε, δ) spent over every noised release by the Rényi DP accountant of the Gaussian mechanism,
the budget left, one line per delta sent and the last run of each domain. With --state it
reads a participant's state file (the federation block's state setting) instead, offline.`,
				Args: cobra.NoArgs,
				RunE: func(c *cobra.Command, _ []string) error {
					asJSON, _ := c.Flags().GetBool("json")
					if path, _ := c.Flags().GetString("state"); path != "" {
						st, err := federation.ReadState(path)
						if err != nil {
							return err
						}
						if asJSON {
							return printJSON(os.Stdout, st)
						}
						return st.WriteStatus(os.Stdout)
					}
					var s app.FederationStatus
					if err := admin.Call(c, http.MethodGet, "/molly/federation/status", nil, &s); err != nil {
						return err
					}
					if asJSON {
						return printJSON(os.Stdout, s)
					}
					return writeStatus(os.Stdout, s)
				},
			}
			status.Flags().String("state", "", "read this participant state file instead of asking the running Molly")
			status.Flags().Bool("json", false, "print JSON")
			cmd.AddCommand(run, status)
		},
	})
}

func printJSON(w io.Writer, v any) error {
	enc := jsonEncoder(w)
	return enc.Encode(v)
}

// writeStatus prints s: the role, the aggregator's listener and peers,
// the participant's privacy spending and deltas, its last runs.
func writeStatus(w io.Writer, s app.FederationStatus) error {
	fmt.Fprintf(w, "role: %s\n", s.Role)
	if s.Listen != "" {
		fmt.Fprintf(w, "aggregator: listening on %s for peers %v\n", s.Listen, s.Peers)
	}
	if s.State == nil {
		return nil
	}
	if err := s.State.WriteStatus(w); err != nil {
		return err
	}
	if len(s.Runs) == 0 {
		return nil
	}
	tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "DOMAIN\tROUND\tPARTICIPANTS\tAGGREGATE\tOUTCOME")
	for _, r := range s.Runs {
		outcome := "refused: " + r.Reason
		switch {
		case r.Error != "":
			outcome = "error: " + r.Error
		case r.Skipped != "":
			outcome = "skipped: " + r.Skipped
		case r.Promoted:
			outcome = "promoted: " + r.Reason
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%s\t%s\n", r.Domain, r.Round, r.Participants, adapters.Short(r.Version), outcome)
	}
	return tw.Flush()
}

func jsonEncoder(w io.Writer) *json.Encoder {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc
}
