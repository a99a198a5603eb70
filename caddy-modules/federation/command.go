// Package federation registers `molly federation`, the command line of
// federated adapter improvement (learning/federation).
package federation

import (
	"fmt"
	"os"

	caddycmd "github.com/caddyserver/caddy/v2/cmd"
	"github.com/spf13/cobra"

	"github.com/molly-gateway/molly/learning/federation"
)

func init() {
	caddycmd.RegisterCommand(caddycmd.Command{
		Name:  "federation",
		Short: "Federated adapter improvement (molly federation status)",
		CobraFunc: func(cmd *cobra.Command) {
			status := &cobra.Command{
				Use:   "status --state <file>",
				Short: "Shows the privacy budget spent (ε at δ) and the deltas this participant sent",
				Long: `Reads the participant's federation state file (the federation block's state setting)
and prints the (ε, δ) spent over every noised release, by the Rényi DP accountant of the
Gaussian mechanism, the budget left, and one line per delta sent.`,
				Args: cobra.NoArgs,
				RunE: func(c *cobra.Command, _ []string) error {
					path, _ := c.Flags().GetString("state")
					if path == "" {
						return fmt.Errorf("--state <file> is required")
					}
					st, err := federation.ReadState(path)
					if err != nil {
						return err
					}
					return st.WriteStatus(os.Stdout)
				},
			}
			status.Flags().String("state", "", "the participant's federation state file")
			cmd.AddCommand(status)
		},
	})
}
