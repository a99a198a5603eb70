package serve

import (
	"fmt"
	"os"

	caddycmd "github.com/caddyserver/caddy/v2/cmd"
	"github.com/spf13/cobra"

	"github.com/molly-gateway/molly/serving"
)

func init() {
	caddycmd.RegisterCommand(caddycmd.Command{
		Name:  "model",
		Short: "Generates models for the T0 engine (molly model demo)",
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
					if err := serving.WriteDemo(out, seed, size); err != nil {
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
		},
	})
}
