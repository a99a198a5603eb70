package auth

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"text/tabwriter"
	"time"

	caddycmd "github.com/caddyserver/caddy/v2/cmd"
	"github.com/spf13/cobra"

	"github.com/molly-gateway/molly/caddy-modules/admin"
	"github.com/molly-gateway/molly/registry"
)

// The `molly keys` command manages members and keys of a running Molly
// through the admin API (admin.api.molly_keys), as `caddy reload` does the
// config: the address comes from --address, else from --config's admin
// setting, else Molly's admin socket (admin.DefaultListen).
func init() {
	caddycmd.RegisterCommand(caddycmd.Command{
		Name:  "keys",
		Short: "Manages members, API keys and budgets of a running Molly (molly keys create|list|revoke|member|usage)",
		CobraFunc: func(cmd *cobra.Command) {
			admin.Flags(cmd)

			create := &cobra.Command{
				Use:   "create --member <name> [--name <label>]",
				Short: "Issues an API key for a member and prints it (shown this once)",
				Args:  cobra.NoArgs,
				RunE: func(c *cobra.Command, _ []string) error {
					member, _ := c.Flags().GetString("member")
					name, _ := c.Flags().GetString("name")
					if member == "" {
						return fmt.Errorf("--member is required")
					}
					var out struct {
						Key    string `json:"key"`
						Prefix string `json:"prefix"`
					}
					if err := admin.Call(c, http.MethodPost, "/molly/keys", map[string]string{"member": member, "name": name}, &out); err != nil {
						return err
					}
					fmt.Fprintf(os.Stderr, "key %s for %s; store it now, it is not shown again:\n", out.Prefix, member)
					fmt.Fprintln(os.Stdout, out.Key)
					return nil
				},
			}
			create.Flags().String("member", "", "the member the key belongs to")
			create.Flags().String("name", "", "a label for the key, e.g. laptop")

			list := &cobra.Command{
				Use:   "list [--member <name>]",
				Short: "Lists keys by prefix (never the keys themselves)",
				Args:  cobra.NoArgs,
				RunE: func(c *cobra.Command, _ []string) error {
					member, _ := c.Flags().GetString("member")
					var keys []registry.Key
					if err := admin.Call(c, http.MethodGet, "/molly/keys?member="+url.QueryEscape(member), nil, &keys); err != nil {
						return err
					}
					tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
					fmt.Fprintln(tw, "PREFIX\tMEMBER\tNAME\tCREATED\tREVOKED")
					for _, k := range keys {
						revoked := "-"
						if !k.Revoked.IsZero() {
							revoked = k.Revoked.Format(time.RFC3339)
						}
						fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", k.Prefix, k.Member, k.Name, k.Created.Format(time.RFC3339), revoked)
					}
					return tw.Flush()
				},
			}
			list.Flags().String("member", "", "only this member's keys")

			revoke := &cobra.Command{
				Use:   "revoke <prefix or key>",
				Short: "Revokes a key; requests with it get 401 from now on",
				Args:  cobra.ExactArgs(1),
				RunE: func(c *cobra.Command, args []string) error {
					// A whole key is cut to its display prefix here, so the
					// secret never travels in a URL (the admin endpoint logs URIs).
					prefix := registry.DisplayPrefix(args[0])
					if err := admin.Call(c, http.MethodDelete, "/molly/keys/"+url.PathEscape(prefix), nil, nil); err != nil {
						return err
					}
					fmt.Fprintf(os.Stderr, "revoked %s\n", prefix)
					return nil
				},
			}

			member := &cobra.Command{
				Use:   "member <name> [--budget <usd> --period day|month] [--rpm <n>] [--tpm <n>] [--models a,b] [--tiers T0,T1] [--tools x,y]",
				Short: "Creates a member or replaces its budget, limits and scopes",
				Args:  cobra.ExactArgs(1),
				RunE: func(c *cobra.Command, args []string) error {
					f := c.Flags()
					m := registry.Member{Name: args[0]}
					m.BudgetUSD, _ = f.GetFloat64("budget")
					m.Period, _ = f.GetString("period")
					m.RPM, _ = f.GetInt("rpm")
					m.TPM, _ = f.GetInt("tpm")
					m.Models, _ = f.GetStringSlice("models")
					m.Tiers, _ = f.GetStringSlice("tiers")
					m.Tools, _ = f.GetStringSlice("tools")
					var out registry.Member
					if err := admin.Call(c, http.MethodPost, "/molly/members", m, &out); err != nil {
						return err
					}
					return json.NewEncoder(os.Stdout).Encode(out)
				},
			}
			member.Flags().Float64("budget", 0, "budget in USD per period (0: none)")
			member.Flags().String("period", "", "budget period: day or month (empty: all time)")
			member.Flags().Int("rpm", 0, "requests per minute (0: unlimited)")
			member.Flags().Int("tpm", 0, "tokens per minute (0: unlimited)")
			member.Flags().StringSlice("models", nil, "model names the member may use (a trailing * matches a prefix)")
			member.Flags().StringSlice("tiers", nil, "tiers the member's requests may reach")
			member.Flags().StringSlice("tools", nil, "tool (function) names the member's requests may declare")

			usage := &cobra.Command{
				Use:   "usage [--member <name>]",
				Short: "Prints usage and spend in the current budget period (JSON)",
				Args:  cobra.NoArgs,
				RunE: func(c *cobra.Command, _ []string) error {
					name, _ := c.Flags().GetString("member")
					var out json.RawMessage
					if err := admin.Call(c, http.MethodGet, "/molly/usage?member="+url.QueryEscape(name), nil, &out); err != nil {
						return err
					}
					_, err := os.Stdout.Write(append(out, '\n'))
					return err
				},
			}
			usage.Flags().String("member", "", "one member (default: all)")

			cmd.AddCommand(create, list, revoke, member, usage)
		},
	})
}
