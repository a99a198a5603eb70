package serve

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"time"

	caddycmd "github.com/caddyserver/caddy/v2/cmd"
	"github.com/spf13/cobra"

	"github.com/molly-gateway/molly/caddy-modules/admin"
	"github.com/molly-gateway/molly/caddy-modules/app"
	"github.com/molly-gateway/molly/serving"
)

func init() {
	caddycmd.RegisterCommand(caddycmd.Command{
		Name:  "model",
		Short: "Generates models for the T0 engine (molly model demo, molly model quantize)",
		CobraFunc: func(cmd *cobra.Command) {
			demo := &cobra.Command{
				Use:   "demo [--out <dir>] [--seed <n>] [--size tiny|small|bench]",
				Short: "Writes the demo base model and LoRA adapters (GGUF) deterministically",
				Long: `Writes <out>/molly-demo.gguf and <out>/adapters/{support,billing,payments,legal}.gguf.
The weights are random but deterministic: the same seed and size give the same bytes.
No model can be downloaded here, so the demo, the tests and the benchmarks use these.`,
				Args: cobra.NoArgs,
				RunE: func(c *cobra.Command, _ []string) error {
					out, _ := c.Flags().GetString("out")
					seed, _ := c.Flags().GetInt64("seed")
					size, _ := c.Flags().GetString("size")
					if err := writeDemoWithProgress(out, seed, size, 100*time.Millisecond); err != nil {
						return err
					}
					fmt.Fprintf(os.Stdout, "wrote %s/%s and %d adapters in %s/%s\n", out, serving.DemoModelFile, len(serving.DemoAdapters), out, serving.DemoAdapterDir)
					return nil
				},
			}
			demo.Flags().String("out", "models/demo", "output directory")
			demo.Flags().Int64("seed", 1, "random seed")
			demo.Flags().String("size", "small", "model size: tiny, small or bench")
			cmd.AddCommand(demo)
			quantize := &cobra.Command{
				Use:   "quantize --model <gguf> --type q8_0|q4_0|q4_k_m|q4_k_s|f16",
				Short: "Converts a GGUF model's weights in place (llama.cpp's llama_model_quantize)",
				Args:  cobra.NoArgs,
				RunE: func(c *cobra.Command, _ []string) error {
					path, _ := c.Flags().GetString("model")
					ftype, _ := c.Flags().GetString("type")
					if path == "" {
						return fmt.Errorf("--model <gguf> is required")
					}
					return quantizeWithProgress(path, ftype)
				},
			}
			quantize.Flags().String("model", "", "the GGUF model to rewrite")
			quantize.Flags().String("type", "q8_0", "weight type: q8_0, q4_0, q4_k_m (Q4_K_M), q4_k_s or f16")
			cmd.AddCommand(quantize)
		},
	})
}

// The `molly adapters` command manages the engine's LoRA adapters on a
// running Molly through the admin API (admin.api.molly), at the address
// admin.Flags resolves (Molly's socket by default).
func init() {
	caddycmd.RegisterCommand(caddycmd.Command{
		Name:  "adapters",
		Short: "Manages the engine's LoRA adapters (molly adapters list|add|remove|rescan) and the specialisation loop's versions (history|import|promote|rollback|train)",
		CobraFunc: func(cmd *cobra.Command) {
			admin.Flags(cmd)
			printJSON := func(v json.RawMessage) error {
				_, err := os.Stdout.Write(append(v, '\n'))
				return err
			}
			list := &cobra.Command{
				Use:   "list",
				Short: "Lists the adapters with their state (hot, warm, cold)",
				Args:  cobra.NoArgs,
				RunE: func(c *cobra.Command, _ []string) error {
					var out json.RawMessage
					if err := admin.Call(c, http.MethodGet, "/molly/adapters", nil, &out); err != nil {
						return err
					}
					return printJSON(out)
				},
			}
			add := &cobra.Command{
				Use:   "add <name> <file in the adapter directory>",
				Short: "Adds an adapter from a GGUF file inside the engine's adapter directory",
				Args:  cobra.ExactArgs(2),
				RunE: func(c *cobra.Command, args []string) error {
					var out json.RawMessage
					if err := admin.Call(c, http.MethodPost, "/molly/adapters", map[string]string{"name": args[0], "path": args[1]}, &out); err != nil {
						return err
					}
					return printJSON(out)
				},
			}
			remove := &cobra.Command{
				Use:   "remove <name>",
				Short: "Removes an adapter",
				Args:  cobra.ExactArgs(1),
				RunE: func(c *cobra.Command, args []string) error {
					return admin.Call(c, http.MethodDelete, "/molly/adapters/"+url.PathEscape(args[0]), nil, nil)
				},
			}
			rescan := &cobra.Command{
				Use:   "rescan",
				Short: "Rescans the adapter directory now",
				Args:  cobra.NoArgs,
				RunE: func(c *cobra.Command, _ []string) error {
					var out json.RawMessage
					if err := admin.Call(c, http.MethodPost, "/molly/adapters/rescan", nil, &out); err != nil {
						return err
					}
					return printJSON(out)
				},
			}
			cmd.AddCommand(list, add, remove, rescan)
			cmd.AddCommand(app.AdapterVersionCommands()...) // history, import, promote, rollback, train
		},
	})
}
