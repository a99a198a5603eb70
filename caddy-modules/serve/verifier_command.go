package serve

import (
	"encoding/json"
	"fmt"
	"os"
	"strings"

	caddycmd "github.com/caddyserver/caddy/v2/cmd"
	"github.com/spf13/cobra"

	"github.com/molly-gateway/molly/serving"
)

// The `molly verifier train` command fits the chain verifier of the T0
// engine's parallel chains (serving.TrainVerifier) from labelled chains.
func init() {
	caddycmd.RegisterCommand(caddycmd.Command{
		Name:  "verifier",
		Short: "Fits the T0 engine's chain verifier from labelled chains (molly verifier train)",
		CobraFunc: func(cmd *cobra.Command) {
			train := &cobra.Command{
				Use:   "train --model <base gguf> --data <jsonl> [--adapter <gguf>] [--out <json>]",
				Short: "Fits a logistic-regression verifier on the base model's last hidden state at each chain's answer",
				Long: `Reads one labelled chain per line:
  {"messages":[{"role":"user","content":"..."}],"reasoning":"...","content":"...","correct":true}
("reasoning" absent for chains without a reasoning block), computes the base model's
last hidden state at the end of each chain's answer exactly as the engine does when it
votes, fits a logistic regression and writes the verifier JSON beside the adapter
(or the base model) it is for: <name>.verifier.json.`,
				Args: cobra.NoArgs,
				RunE: func(c *cobra.Command, _ []string) error {
					model, _ := c.Flags().GetString("model")
					data, _ := c.Flags().GetString("data")
					adapter, _ := c.Flags().GetString("adapter")
					out, _ := c.Flags().GetString("out")
					l2, _ := c.Flags().GetFloat64("l2")
					cfg := serving.Config{ModelPath: model, NSeqMax: 1, NCtx: 0}
					cfg.Reasoning.AnswerRegex, _ = c.Flags().GetString("answer-regex")
					cfg.Reasoning.AnswerField, _ = c.Flags().GetString("answer-field")
					v, err := TrainVerifier(cfg, data, l2)
					if err != nil {
						return err
					}
					if out == "" {
						out = serving.VerifierPath(model)
						if adapter != "" {
							out = serving.VerifierPath(adapter)
						}
					}
					return writeHead(out, v)
				},
			}
			train.Flags().String("model", "", "the base model GGUF (its hidden states are the features)")
			train.Flags().String("data", "", "labelled chains, JSON lines")
			train.Flags().String("adapter", "", "the adapter GGUF the verifier is for (default: the base model)")
			train.Flags().String("out", "", "output path (default: beside the adapter or model, .verifier.json)")
			train.Flags().String("answer-regex", "", "the engine's reasoning answer_regex (where the answer ends)")
			train.Flags().String("answer-field", "", "the engine's reasoning answer_field")
			train.Flags().Float64("l2", 1e-3, "L2 regularisation of the weights")
			cmd.AddCommand(train)
		},
	})
	caddycmd.RegisterCommand(caddycmd.Command{
		Name:  "switcher",
		Short: "Fits the T0 engine's reasoning-switcher probe from labelled prompts (molly switcher train)",
		CobraFunc: func(cmd *cobra.Command) {
			train := &cobra.Command{
				Use:   "train --model <base gguf> --data <jsonl> --out <json>",
				Short: "Fits a logistic-regression probe on the prompt's mean hidden state and difficulty",
				Long: `Reads one labelled prompt per line:
  {"messages":[{"role":"user","content":"..."}],"hard":true}
("hard": reasoning helped), computes the base model's mean hidden state over the templated
prompt and the capability difficulty of its last user message, fits a logistic regression
and writes the probe for the engine's reasoning_probe.`,
				Args: cobra.NoArgs,
				RunE: func(c *cobra.Command, _ []string) error {
					model, _ := c.Flags().GetString("model")
					data, _ := c.Flags().GetString("data")
					out, _ := c.Flags().GetString("out")
					l2, _ := c.Flags().GetFloat64("l2")
					if out == "" {
						return fmt.Errorf("--out <json> is required")
					}
					v, err := TrainProbe(serving.Config{ModelPath: model, NSeqMax: 1}, data, l2)
					if err != nil {
						return err
					}
					return writeHead(out, v)
				},
			}
			train.Flags().String("model", "", "the base model GGUF")
			train.Flags().String("data", "", "labelled prompts, JSON lines")
			train.Flags().String("out", "", "output path of the probe JSON")
			train.Flags().Float64("l2", 1e-3, "L2 regularisation of the weights")
			cmd.AddCommand(train)
		},
	})
}

// writeHead writes a fitted linear head (verifier or probe) as JSON to out
// and says so on stdout.
func writeHead(out string, v *serving.Verifier) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	if err := os.WriteFile(out, append(b, '\n'), 0o644); err != nil {
		return err
	}
	fmt.Fprintf(os.Stdout, "wrote %s: %d examples, train accuracy %.4f\n", out, v.Examples, v.TrainAccuracy)
	return nil
}

// TrainProbe opens an engine on cfg, reads the labelled prompts at data
// (one serving.ProbeExample per line) and fits the switcher's probe.
// Errors: a missing model or data file, bad lines, serving.TrainProbe's.
func TrainProbe(cfg serving.Config, data string, l2 float64) (*serving.Verifier, error) {
	if cfg.ModelPath == "" || data == "" {
		return nil, fmt.Errorf("--model <gguf> and --data <jsonl> are required")
	}
	b, err := os.ReadFile(data)
	if err != nil {
		return nil, err
	}
	var examples []serving.ProbeExample
	for i, line := range strings.Split(string(b), "\n") {
		if strings.TrimSpace(line) == "" {
			continue
		}
		var ex serving.ProbeExample
		if err := json.Unmarshal([]byte(line), &ex); err != nil || len(ex.Messages) == 0 {
			return nil, fmt.Errorf("%s: line %d: not a labelled prompt (%v)", data, i+1, err)
		}
		examples = append(examples, ex)
	}
	if cfg.Threads == 0 {
		cfg.Threads = 1
	}
	e, err := serving.New(cfg)
	if err != nil {
		return nil, err
	}
	defer e.Close()
	return e.TrainProbe(examples, l2)
}

// TrainVerifier opens an engine on cfg (no adapters are needed: the
// features are the base model's), reads the labelled chains at data and
// fits a verifier. Errors: a missing model or data file, bad lines, and
// serving.TrainVerifier's.
func TrainVerifier(cfg serving.Config, data string, l2 float64) (*serving.Verifier, error) {
	if cfg.ModelPath == "" || data == "" {
		return nil, fmt.Errorf("--model <gguf> and --data <jsonl> are required")
	}
	f, err := os.Open(data)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	examples, err := serving.ReadVerifierExamples(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", data, err)
	}
	if cfg.Threads == 0 {
		cfg.Threads = 1
	}
	e, err := serving.New(cfg)
	if err != nil {
		return nil, err
	}
	defer e.Close()
	return e.TrainVerifier(examples, l2)
}
