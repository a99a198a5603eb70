package app

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	caddycmd "github.com/caddyserver/caddy/v2/cmd"
	"github.com/spf13/cobra"

	"github.com/molly-gateway/molly/caddy-modules/admin"
	"github.com/molly-gateway/molly/internal/progress"
	"github.com/molly-gateway/molly/learning/adapters"
	"github.com/molly-gateway/molly/learning/curate"
	"github.com/molly-gateway/molly/learning/eval"
	"github.com/molly-gateway/molly/learning/lora"
	"github.com/molly-gateway/molly/registry"
)

// adminRaw is admin.Call for answers that are not one JSON value (JSONL):
// the caller reads and closes the body. A status of 400 or more is an
// error with the endpoint's message.
func adminRaw(c *cobra.Command, method, uri string, body io.Reader) (*http.Response, error) {
	address, _ := c.Flags().GetString("address")
	config, _ := c.Flags().GetString("config")
	adapter, _ := c.Flags().GetString("adapter")
	addr, err := caddycmd.DetermineAdminAPIAddress(address, nil, config, adapter)
	if err != nil {
		return nil, fmt.Errorf("finding the admin API: %w", err)
	}
	resp, err := caddycmd.AdminAPIRequest(addr, method, uri, nil, body)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", method, strings.SplitN(uri, "?", 2)[0], err)
	}
	return resp, nil
}

func printJSON(v any) error {
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// The `molly specialise` and `molly traces` commands drive the
// specialisation loop of a running Molly through admin.api.molly_learning.
func init() {
	caddycmd.RegisterCommand(caddycmd.Command{
		Name:  "specialise",
		Short: "Runs a specialisation cycle on a running Molly (molly specialise run --once)",
		CobraFunc: func(cmd *cobra.Command) {
			admin.Flags(cmd)
			run := &cobra.Command{
				Use:   "run --once",
				Short: "Curates, trains, evaluates and gates every domain with enough new traces, now; prints the cycle's report",
				Args:  cobra.NoArgs,
				RunE: func(c *cobra.Command, _ []string) error {
					if once, _ := c.Flags().GetBool("once"); !once {
						return errors.New("pass --once: scheduled cycles run inside Molly (specialise { every <duration> })")
					}
					var rep json.RawMessage
					if err := admin.Call(c, http.MethodPost, "/molly/specialise/run", nil, &rep); err != nil {
						return err
					}
					_, err := os.Stdout.Write(append(rep, '\n'))
					return err
				},
			}
			run.Flags().Bool("once", false, "run one cycle and exit")
			cmd.AddCommand(run)
		},
	})
	caddycmd.RegisterCommand(caddycmd.Command{
		Name:  "traces",
		Short: "Lists, exports, imports and deletes the consented traces of a running Molly (molly traces list|export|import|delete|consent)",
		CobraFunc: func(cmd *cobra.Command) {
			admin.Flags(cmd)
			list := &cobra.Command{
				Use:   "list [--member m] [--category c] [--limit n]",
				Short: "Lists traces (no text)",
				Args:  cobra.NoArgs,
				RunE: func(c *cobra.Command, _ []string) error {
					q := url.Values{}
					for _, f := range []string{"member", "category", "limit"} {
						if v, _ := c.Flags().GetString(f); v != "" {
							q.Set(f, v)
						}
					}
					var ts []TraceInfo
					if err := admin.Call(c, http.MethodGet, "/molly/traces?"+q.Encode(), nil, &ts); err != nil {
						return err
					}
					tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
					fmt.Fprintln(tw, "ID\tMEMBER\tCATEGORY\tTIER\tMODEL\tLABEL\tFEEDBACK\tCREATED")
					for _, t := range ts {
						fb := "-"
						if t.Feedback >= 0 {
							fb = fmt.Sprintf("%.2f", t.Feedback)
						}
						fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", t.ID, t.Member, t.Category, t.Tier, t.ServedModel, t.Label, fb, t.Created.Format(time.RFC3339))
					}
					return tw.Flush()
				},
			}
			list.Flags().String("member", "", "only this member's")
			list.Flags().String("category", "", "only this task category's")
			list.Flags().String("limit", "", "at most this many")
			export := &cobra.Command{
				Use:   "export (--set s | --domain d) [--split train|held_out] [--out file]",
				Short: "Writes a curated set, or a set curated now from a domain's traces, as OpenAI fine-tuning JSONL",
				Args:  cobra.NoArgs,
				RunE: func(c *cobra.Command, _ []string) error {
					q := url.Values{}
					for _, f := range []string{"set", "domain", "split"} {
						if v, _ := c.Flags().GetString(f); v != "" {
							q.Set(f, v)
						}
					}
					resp, err := adminRaw(c, http.MethodGet, "/molly/traces/export?"+q.Encode(), nil)
					if err != nil {
						return err
					}
					defer resp.Body.Close()
					var w io.Writer = os.Stdout
					if out, _ := c.Flags().GetString("out"); out != "" {
						f, err := os.Create(out)
						if err != nil {
							return err
						}
						defer f.Close()
						w = f
					}
					_, err = io.Copy(w, resp.Body)
					return err
				},
			}
			export.Flags().String("set", "", "a stored curated set")
			export.Flags().String("domain", "", "a task category whose traces to curate now")
			export.Flags().String("split", "", "train or held_out (default: both)")
			export.Flags().String("out", "", "file to write (default: standard output)")
			imp := &cobra.Command{
				Use:   "import --set s --domain d <file.jsonl>",
				Short: "Imports OpenAI chat fine-tuning JSONL as a curated set",
				Args:  cobra.ExactArgs(1),
				RunE: func(c *cobra.Command, args []string) error {
					set, _ := c.Flags().GetString("set")
					domain, _ := c.Flags().GetString("domain")
					f, err := os.Open(args[0])
					if err != nil {
						return err
					}
					defer f.Close()
					resp, err := adminRaw(c, http.MethodPost, "/molly/traces/import?"+url.Values{"set": {set}, "domain": {domain}}.Encode(), f)
					if err != nil {
						return err
					}
					defer resp.Body.Close()
					_, err = io.Copy(os.Stdout, resp.Body)
					return err
				},
			}
			imp.Flags().String("set", "", "the curated set's name")
			imp.Flags().String("domain", "", "its task category (an adapter's name)")
			del := &cobra.Command{
				Use:   "delete --member m",
				Short: "Forgets a member: deletes their traces and curated items (adapters trained on them are listed)",
				Args:  cobra.NoArgs,
				RunE: func(c *cobra.Command, _ []string) error {
					m, _ := c.Flags().GetString("member")
					if m == "" {
						return errors.New("--member is required")
					}
					var gone registry.Forgotten
					if err := admin.Call(c, http.MethodDelete, "/molly/traces?"+url.Values{"member": {m}}.Encode(), nil, &gone); err != nil {
						return err
					}
					fmt.Printf("deleted %d traces and %d curated items of %s", gone.Traces, gone.CuratedItems, m)
					if len(gone.Adapters) > 0 {
						fmt.Printf("; adapter versions trained on some of them: %s", strings.Join(gone.Adapters, ", "))
					}
					fmt.Println()
					return nil
				},
			}
			del.Flags().String("member", "", "the member to forget")
			consent := &cobra.Command{
				Use:   "consent (--member m | --key prefix) on|off [--retention-days n]",
				Short: "Sets a standing consent to trace capture (a request's X-Molly-Trace header overrides it)",
				Args:  cobra.ExactArgs(1),
				RunE: func(c *cobra.Command, args []string) error {
					m, _ := c.Flags().GetString("member")
					k, _ := c.Flags().GetString("key")
					days, _ := c.Flags().GetInt("retention-days")
					if (m == "") == (k == "") {
						return errors.New("name one of --member or --key")
					}
					if args[0] != "on" && args[0] != "off" {
						return fmt.Errorf("consent %q: want on or off", args[0])
					}
					body := map[string]any{"scope": registry.ConsentMember, "name": m, "trace": args[0] == "on", "retention_days": days}
					if k != "" {
						body["scope"], body["name"] = registry.ConsentKey, k
					}
					var out json.RawMessage
					if err := admin.Call(c, http.MethodPost, "/molly/traces/consent", body, &out); err != nil {
						return err
					}
					_, err := os.Stdout.Write(append(out, '\n'))
					return err
				},
			}
			consent.Flags().String("member", "", "a member's standing consent")
			consent.Flags().String("key", "", "an API key's (its prefix)")
			consent.Flags().Int("retention-days", 0, "how long the member's traces are kept (0: the loop's default)")
			cmd.AddCommand(list, export, imp, del, consent)
		},
	})
}

// AdapterVersionCommands are the subcommands of `molly adapters` for the
// specialisation loop's versions: history, import, promote, rollback (through
// admin.api.molly_learning) and train (on this machine, from a curated
// set in the registry file).
func AdapterVersionCommands() []*cobra.Command {
	history := &cobra.Command{
		Use:   "history [name]",
		Short: "Lists adapter versions (content hash, base, scores, verdict) and promotion history",
		Args:  cobra.MaximumNArgs(1),
		RunE: func(c *cobra.Command, args []string) error {
			var es []adapters.Entry
			if err := admin.Call(c, http.MethodGet, "/molly/adapter-versions", nil, &es); err != nil {
				return err
			}
			tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
			for _, e := range es {
				if len(args) == 1 && e.Name != args[0] {
					continue
				}
				fmt.Fprintf(tw, "%s\tserving %s\n", e.Name, adapters.Short(e.Serving))
				fmt.Fprintln(tw, "  VERSION\tSOURCE\tSET\tVERDICT\tCREATED")
				for _, v := range e.Versions {
					fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%s\n", adapters.Short(v.Version), v.Source, v.Set, v.Verdict, v.Created.Format(time.RFC3339))
				}
				fmt.Fprintln(tw, "  WHEN\tACTION\tVERSION\tREASON")
				for _, h := range e.History {
					fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\n", h.Created.Format(time.RFC3339), h.Action, adapters.Short(h.Version), h.Reason)
				}
			}
			return tw.Flush()
		},
	}
	promote := &cobra.Command{
		Use:   "promote <name> <version> [--reason r]",
		Short: "Serves a version (a prefix of its hash) as <name>, hot-swapped; the router's prior follows its evaluation",
		Args:  cobra.ExactArgs(2),
		RunE: func(c *cobra.Command, args []string) error {
			reason, _ := c.Flags().GetString("reason")
			var out map[string]string
			if err := admin.Call(c, http.MethodPost, "/molly/adapter-versions/promote", map[string]string{"name": args[0], "version": args[1], "reason": reason}, &out); err != nil {
				return err
			}
			return printJSON(out)
		},
	}
	promote.Flags().String("reason", "", "why, for the history")
	imp := &cobra.Command{
		Use:   "import <name> <file in the engine's adapter directory>",
		Short: "Records an adapter GGUF (an external trainer's) as a version of <name>, pinned to the base; promote it to serve it",
		Args:  cobra.ExactArgs(2),
		RunE: func(c *cobra.Command, args []string) error {
			var out json.RawMessage
			if err := admin.Call(c, http.MethodPost, "/molly/adapter-versions", map[string]string{"name": args[0], "path": args[1]}, &out); err != nil {
				return err
			}
			_, err := os.Stdout.Write(append(out, '\n'))
			return err
		},
	}
	rollback := &cobra.Command{
		Use:   "rollback <name> [--reason r]",
		Short: "Serves the version <name> served before the current one",
		Args:  cobra.ExactArgs(1),
		RunE: func(c *cobra.Command, args []string) error {
			reason, _ := c.Flags().GetString("reason")
			var out map[string]string
			if err := admin.Call(c, http.MethodPost, "/molly/adapter-versions/rollback", map[string]string{"name": args[0], "reason": reason}, &out); err != nil {
				return err
			}
			return printJSON(out)
		},
	}
	rollback.Flags().String("reason", "", "why, for the history")
	train := &cobra.Command{
		Use:   "train --set s --base model.gguf [--rank r] [--steps n] [--out adapter.gguf]",
		Short: "Trains a LoRA adapter GGUF for a base on a curated set of the registry, on this machine; interruptible and resumable",
		Long: `Trains LoRA A/B (learning/lora) on the training split of curated set s, read
from the registry file, for the GGUF base model: a progress bar on a terminal,
structured lines otherwise. Ctrl-C checkpoints; the same command resumes.`,
		Args: cobra.NoArgs,
		RunE: runTrain,
	}
	train.Flags().String("set", "", "curated set name (molly traces export --set, or a cycle's auto-<domain>-<time>)")
	train.Flags().String("base", "", "the T0 base model GGUF")
	train.Flags().Int("rank", 8, "LoRA rank")
	train.Flags().Int("steps", 100, "optimiser steps")
	train.Flags().Int("batch-size", 8, "examples per step")
	train.Flags().Float64("learning-rate", 1e-2, "Adam's learning rate")
	train.Flags().Int("threads", 0, "trainer threads (0: all)")
	train.Flags().String("out", "", "adapter GGUF to write (default <set>.gguf)")
	train.Flags().String("name", "", "adapter name recorded in the file (default: the set's domain)")
	train.Flags().String("registry", "", "registry file (default: Molly's, "+DefaultRegistry()+")")
	return []*cobra.Command{history, imp, promote, rollback, train}
}

func runTrain(c *cobra.Command, _ []string) error {
	f := c.Flags()
	setName, _ := f.GetString("set")
	base, _ := f.GetString("base")
	if setName == "" || base == "" {
		return errors.New("--set and --base are required")
	}
	rank, _ := f.GetInt("rank")
	steps, _ := f.GetInt("steps")
	batch, _ := f.GetInt("batch-size")
	lr, _ := f.GetFloat64("learning-rate")
	threads, _ := f.GetInt("threads")
	out, _ := f.GetString("out")
	name, _ := f.GetString("name")
	regPath, _ := f.GetString("registry")
	if rank < 1 || steps < 1 || batch < 1 || lr <= 0 || threads < 0 {
		return errors.New("--rank, --steps, --batch-size and --learning-rate must be positive")
	}
	if regPath == "" {
		regPath = DefaultRegistry()
	}
	reg, err := registry.Open(regPath, registry.Options{})
	if err != nil {
		return fmt.Errorf("registry %s: %w", regPath, err)
	}
	defer reg.Close()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	set, err := reg.CuratedSet(ctx, setName)
	if err != nil {
		return fmt.Errorf("curated set %q: %w", setName, err)
	}
	if name == "" {
		name = set.Domain
	}
	if out == "" {
		out = setName + ".gguf"
	}
	pairs, err := curate.Pairs(set, registry.SplitTrain)
	if err != nil {
		return err
	}
	ev, err := eval.Open(base)
	if err != nil {
		return err
	}
	defer ev.Close()
	exs, err := ev.EncodeAll(pairs)
	if err != nil {
		return err
	}
	m, err := lora.LoadModel(base)
	if err != nil {
		return err
	}
	ckpt := out + ".ckpt"
	rep := progress.New(os.Stderr, progress.Options{})
	task := rep.Start("training "+name+" on "+filepath.Base(base), int64(steps), progress.Items)
	res, err := lora.Train(ctx, m, exs, lora.Options{Rank: rank, Steps: steps, BatchSize: batch, LR: lr, Threads: threads, Checkpoint: ckpt,
		Progress: func(p lora.Progress) {
			task.Set(int64(p.Step), fmt.Sprintf("loss %.3f, %.0f tokens/s, ETA %s", p.Loss, p.TokensPerS, p.ETA.Round(time.Second)))
		}})
	if errors.Is(err, lora.ErrOtherRun) {
		task.Fail(err)
		return fmt.Errorf("%w: remove %s to start afresh", err, ckpt)
	}
	if err != nil {
		task.Fail(err)
		if errors.Is(err, lora.ErrInterrupted) {
			return fmt.Errorf("%w; the same command resumes from %s", err, ckpt)
		}
		return err
	}
	task.Done()
	if err := res.Adapter.WriteGGUF(out, m, name); err != nil {
		return err
	}
	os.Remove(ckpt)
	secs := res.Elapsed.Seconds()
	fmt.Printf("wrote %s: %s, rank %d, %d steps, last loss %.4f, %d tokens in %.1fs (%.0f tokens/s)\n",
		out, name, rank, res.Steps, res.Loss, res.Tokens, secs, float64(res.Tokens)/max(secs, 1e-9))
	return nil
}
