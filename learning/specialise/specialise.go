// Package specialise runs Molly's learning loop (docs/architecture.md): for each
// domain with enough new consented traces, curate a set, train a LoRA
// adapter for the T0 base (learning/lora, or an external trainer),
// evaluate it on the held-out split and the general probes with the
// engine's own logits (learning/eval), and promote it through the gate
// (learning/adapters), which sets the router's prior so traffic of that
// category moves to T0 when the adapter now beats the incumbent. A cycle
// that fails at any step leaves the serving adapters as they were:
// promotion is its last step.
package specialise

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/molly-gateway/molly/learning/adapters"
	"github.com/molly-gateway/molly/learning/curate"
	"github.com/molly-gateway/molly/learning/eval"
	"github.com/molly-gateway/molly/learning/lora"
	"github.com/molly-gateway/molly/learning/traces"
	"github.com/molly-gateway/molly/registry"
)

// Config is the specialise block of the molly app. Zero values take the
// defaults noted.
type Config struct {
	// Every runs a cycle at this interval; At ("15:04", local time) runs
	// one daily instead. Neither: cycles run only when asked (RunOnce,
	// `molly specialise run --once`).
	Every time.Duration `json:"every,omitempty"`
	At    string        `json:"at,omitempty"`
	// MinTraces is the least number of new traces a domain needs since
	// its last cycle to train (default 50).
	MinTraces int `json:"min_traces,omitempty"`
	// Budget is the CPU time one domain's training may use (default 10m):
	// with T trainer threads it runs for at most Budget/T of wall-clock
	// time, so it can never use more than Budget of CPU; a training still
	// running then is interrupted, checkpointed and counts as failed for
	// the cycle. An external trainer (whose threads Molly does not know)
	// gets Budget of wall-clock time.
	Budget time.Duration `json:"budget,omitempty"`
	// Domains limits the loop to these task categories; empty: every
	// category with traces.
	Domains []string `json:"domains,omitempty"`
	// Training: LoRA rank (default 8), optimiser steps (default 100),
	// examples per step (default 8), learning rate (default 1e-2), and the
	// trainer's threads (default: all).
	Rank      int     `json:"rank,omitempty"`
	Steps     int     `json:"steps,omitempty"`
	BatchSize int     `json:"batch_size,omitempty"`
	LR        float64 `json:"learning_rate,omitempty"`
	Threads   int     `json:"threads,omitempty"`
	// Gate is the promotion gate (margin, regression_budget).
	Gate eval.Gate `json:"gate,omitempty"`
	// HeldOut is the share of prompts held out (default 0.2).
	HeldOut float64 `json:"held_out,omitempty"`
	// ExternalTrainer, when set, is run instead of the built-in trainer:
	// argv with the placeholders {train} (the training JSONL), {heldout}
	// (the held-out JSONL), {base} (the base GGUF), {out} (where the
	// adapter GGUF must be written), {rank} and {steps}.
	ExternalTrainer []string `json:"external_trainer,omitempty"`
	// RetentionDays is how long traces are kept when a member's consent
	// sets nothing (default 90; negative: forever).
	RetentionDays int `json:"retention_days,omitempty"`
	// Dir holds adapter versions and checkpoints (default: beside the
	// registry, set by the app).
	Dir string `json:"dir,omitempty"`
}

// Validate rejects impossible settings with a sentence naming the field.
func (c Config) Validate() error {
	if c.Every < 0 || c.Budget < 0 {
		return errors.New("specialise: every and budget must not be negative")
	}
	if c.At != "" {
		if _, err := time.Parse("15:04", c.At); err != nil {
			return fmt.Errorf("specialise: at %q must be a time of day such as 03:30", c.At)
		}
		if c.Every > 0 {
			return errors.New("specialise: set every or at, not both")
		}
	}
	if c.MinTraces < 0 || c.Rank < 0 || c.Steps < 0 || c.BatchSize < 0 || c.LR < 0 || c.Threads < 0 {
		return errors.New("specialise: min_traces, rank, steps, batch_size, learning_rate and threads must not be negative")
	}
	if c.HeldOut < 0 || c.HeldOut >= 1 {
		return fmt.Errorf("specialise: held_out %v must be in [0,1)", c.HeldOut)
	}
	if c.Gate.Margin < 0 || c.Gate.RegressionBudget < 0 {
		return errors.New("specialise: gate margin and regression_budget must not be negative")
	}
	return nil
}

func (c *Config) defaults() {
	if c.MinTraces == 0 {
		c.MinTraces = 50
	}
	if c.Budget == 0 {
		c.Budget = 10 * time.Minute
	}
	if c.Rank == 0 {
		c.Rank = 8
	}
	if c.Steps == 0 {
		c.Steps = 100
	}
	if c.BatchSize == 0 {
		c.BatchSize = 8
	}
	if c.LR == 0 {
		c.LR = 1e-2
	}
	if c.HeldOut == 0 {
		c.HeldOut = 0.2
	}
}

// Deps are what a loop works with.
type Deps struct {
	Registry  *registry.Registry
	BaseModel string          // the T0 base GGUF the engine serves
	Engine    adapters.Engine // nil: versions are evaluated and recorded, nothing is served
	Priors    adapters.Priors // nil: no prior is set
	Target    string          // the T0 target's name (the prior's key)
	// Seed is the target's configured quality prior for (model, category)
	// (route.Target.Seed), what a promotion's gain starts from; nil: 0.5.
	Seed     func(model, category string) float64
	Recorder *traces.Recorder // flushed and pruned before each cycle; may be nil
	Logger   *zap.Logger
	// Progress, when set, gets every training step of domain.
	Progress func(domain string, p lora.Progress)
	// OnCycle, when set, is called with the report of every cycle that
	// completed (scheduled or RunOnce), after its promotions; it must not
	// block (the federation hands its work to a goroutine).
	OnCycle func(Report)
}

// Loop runs cycles, one at a time.
type Loop struct {
	cfg   Config
	d     Deps
	store *adapters.Store
	mu    sync.Mutex // one cycle at a time
	model *lora.Model
	stop  chan struct{}
	done  chan struct{}
}

// ErrBusy is returned by RunOnce while another cycle runs.
var ErrBusy = errors.New("a specialisation cycle is already running")

// New prepares a loop. Errors: bad config, the base cannot be read.
func New(cfg Config, d Deps) (*Loop, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.defaults()
	if d.Logger == nil {
		d.Logger = zap.NewNop()
	}
	if cfg.Dir == "" {
		return nil, errors.New("specialise: dir is required")
	}
	base, err := adapters.BaseOf(d.BaseModel)
	if err != nil {
		return nil, fmt.Errorf("specialise: base model: %w", err)
	}
	return &Loop{cfg: cfg, d: d, store: &adapters.Store{Registry: d.Registry, Dir: filepath.Join(cfg.Dir, "versions"), Base: base}}, nil
}

// Store is the loop's adapter store (for the admin API and the CLI).
func (l *Loop) Store() *adapters.Store { return l.store }

// Promotion is where the loop's promotions apply.
func (l *Loop) Promotion() adapters.Promotion {
	return adapters.Promotion{Engine: l.d.Engine, Priors: l.d.Priors, Target: l.d.Target, Seed: l.d.Seed}
}

// Report is one cycle.
type Report struct {
	Started  time.Time      `json:"started"`
	Finished time.Time      `json:"finished"`
	Pruned   int            `json:"pruned"`
	Domains  []DomainReport `json:"domains"`
}

// DomainReport is one domain's part of a cycle.
type DomainReport struct {
	Domain     string               `json:"domain"`
	NewTraces  int                  `json:"new_traces"`
	Skipped    string               `json:"skipped,omitempty"` // why no training happened
	Set        string               `json:"set,omitempty"`
	Curation   *curate.Report       `json:"curation,omitempty"`
	Version    string               `json:"version,omitempty"`
	Evaluation *adapters.Evaluation `json:"evaluation,omitempty"`
	Promoted   bool                 `json:"promoted"`
	Error      string               `json:"error,omitempty"`
	// Training figures of the built-in trainer.
	TrainSteps      int     `json:"train_steps,omitempty"`
	TrainTokens     int64   `json:"train_tokens,omitempty"`
	TrainSeconds    float64 `json:"train_seconds,omitempty"`
	TrainTokensPerS float64 `json:"train_tokens_per_s,omitempty"`
}

func watermarkKey(domain string) string { return "specialise.watermark." + domain }

// RunOnce runs one cycle now. Errors: ErrBusy, the registry's; a
// domain's failure is in its report, not an error.
func (l *Loop) RunOnce(ctx context.Context) (Report, error) {
	if !l.mu.TryLock() {
		return Report{}, ErrBusy
	}
	defer l.mu.Unlock()
	rep := Report{Started: time.Now()}
	if r := l.d.Recorder; r != nil {
		if err := r.Flush(ctx); err != nil {
			return rep, err
		}
		n, err := r.Prune(ctx, time.Now())
		if err != nil {
			return rep, err
		}
		rep.Pruned = n
	}
	counts, err := l.d.Registry.TraceCounts(ctx, 0)
	if err != nil {
		return rep, err
	}
	for _, c := range counts {
		if len(l.cfg.Domains) > 0 && !slices.Contains(l.cfg.Domains, c.Category) {
			continue
		}
		dr := DomainReport{Domain: c.Category}
		mark, _, err := l.d.Registry.Meta(ctx, watermarkKey(c.Category))
		if err != nil {
			return rep, err
		}
		after, _ := strconv.ParseInt(mark, 10, 64)
		fresh, err := l.d.Registry.TraceCounts(ctx, after)
		if err != nil {
			return rep, err
		}
		for _, f := range fresh {
			if f.Category == c.Category {
				dr.NewTraces = f.N
			}
		}
		if dr.NewTraces < l.cfg.MinTraces {
			dr.Skipped = fmt.Sprintf("%d new traces, %d needed", dr.NewTraces, l.cfg.MinTraces)
			rep.Domains = append(rep.Domains, dr)
			continue
		}
		if err := l.domain(ctx, &dr); err != nil {
			dr.Error = err.Error()
			l.d.Logger.Warn("specialisation failed; the serving adapters are unchanged", zap.String("domain", dr.Domain), zap.Error(err))
		} else if err := l.d.Registry.SetMeta(ctx, watermarkKey(c.Category), strconv.FormatInt(c.MaxID, 10)); err != nil {
			return rep, err
		}
		rep.Domains = append(rep.Domains, dr)
	}
	rep.Finished = time.Now()
	if l.d.OnCycle != nil {
		l.d.OnCycle(rep)
	}
	return rep, nil
}

// domain curates, trains, evaluates and gates one domain.
func (l *Loop) domain(ctx context.Context, dr *DomainReport) error {
	reg := l.d.Registry
	ts, err := reg.Traces(ctx, registry.TraceQuery{Category: dr.Domain})
	if err != nil {
		return err
	}
	name := fmt.Sprintf("auto-%s-%s", dr.Domain, time.Now().UTC().Format("20060102T150405.000"))
	set, crep := curate.Curate(name, dr.Domain, ts, curate.Options{HeldOut: l.cfg.HeldOut})
	dr.Curation, dr.Set = &crep, name
	if crep.Train < 2 || crep.HeldOut < 1 {
		dr.Skipped = fmt.Sprintf("curation kept %d training and %d held-out pairs", crep.Train, crep.HeldOut)
		return nil
	}
	if err := reg.PutCuratedSet(ctx, set); err != nil {
		return err
	}
	ev, err := eval.Open(l.d.BaseModel)
	if err != nil {
		return err
	}
	defer ev.Close()
	trainPairs, err := curate.Pairs(set, registry.SplitTrain)
	if err != nil {
		return err
	}
	heldPairs, err := curate.Pairs(set, registry.SplitHeldOut)
	if err != nil {
		return err
	}
	out := filepath.Join(l.cfg.Dir, "candidate-"+dr.Domain+".gguf")
	defer os.Remove(out)
	source := "trained"
	if len(l.cfg.ExternalTrainer) > 0 {
		source = "external"
		if err := l.external(ctx, set, out); err != nil {
			return err
		}
	} else {
		res, err := l.train(ctx, ev, dr.Domain, trainPairs, out)
		if err != nil {
			return err
		}
		dr.TrainSteps, dr.TrainTokens, dr.TrainSeconds = res.Steps, res.Tokens, res.Elapsed.Seconds()
		if s := res.Elapsed.Seconds(); s > 0 {
			dr.TrainTokensPerS = float64(res.Tokens) / s
		}
	}
	v, err := l.store.Add(ctx, dr.Domain, out, source, set.Name, crep.TrainTraces)
	if err != nil {
		return err
	}
	dr.Version = v.Version
	evaluation, err := l.evaluate(ctx, ev, dr.Domain, v, heldPairs)
	if err != nil {
		return err
	}
	dr.Evaluation = &evaluation
	v.Scores = mustJSON(evaluation)
	v.Verdict = "refused"
	if evaluation.Verdict.Promote {
		v.Verdict = "promoted"
	}
	if err := reg.PutAdapterVersion(ctx, v, nil); err != nil {
		return err
	}
	if !evaluation.Verdict.Promote {
		return reg.AddAdapterEvent(ctx, registry.AdapterEvent{Name: dr.Domain, Version: v.Version, Action: "refuse", Reason: evaluation.Verdict.Reason})
	}
	if _, err := l.store.Promote(ctx, l.Promotion(), dr.Domain, v.Version, "promote", evaluation.Verdict.Reason); err != nil {
		return err
	}
	dr.Promoted = true
	l.d.Logger.Info("adapter promoted", zap.String("domain", dr.Domain), zap.String("version", adapters.Short(v.Version)),
		zap.Float64("domain_gain", evaluation.Verdict.DomainGain), zap.Float64("general_regression", evaluation.Verdict.GeneralRegression),
		zap.Float64("quality", evaluation.Quality))
	return nil
}

// train runs the built-in trainer on pairs and writes the adapter to out.
func (l *Loop) train(ctx context.Context, ev *eval.Evaluator, domain string, pairs []eval.Pair, out string) (lora.Result, error) {
	if l.model == nil {
		m, err := lora.LoadModel(l.d.BaseModel)
		if err != nil {
			return lora.Result{}, err
		}
		l.model = m
	}
	exs, err := ev.EncodeAll(pairs)
	if err != nil {
		return lora.Result{}, err
	}
	ckpt := filepath.Join(l.cfg.Dir, "checkpoints", domain+".ckpt")
	if err := os.MkdirAll(filepath.Dir(ckpt), 0o755); err != nil {
		return lora.Result{}, err
	}
	o := lora.Options{Rank: l.cfg.Rank, Steps: l.cfg.Steps, BatchSize: l.cfg.BatchSize, LR: l.cfg.LR, Threads: l.cfg.Threads, Checkpoint: ckpt}
	if l.d.Progress != nil {
		o.Progress = func(p lora.Progress) { l.d.Progress(domain, p) }
	}
	tctx, cancel := context.WithTimeout(ctx, TrainingWall(l.cfg.Budget, l.cfg.Threads))
	defer cancel()
	res, err := lora.Train(tctx, l.model, exs, o)
	if errors.Is(err, lora.ErrOtherRun) {
		// The checkpoint is of an earlier cycle's data: start afresh.
		os.Remove(ckpt)
		res, err = lora.Train(tctx, l.model, exs, o)
	}
	if err != nil {
		return res, fmt.Errorf("training %s: %w", domain, err)
	}
	os.Remove(ckpt)
	return res, res.Adapter.WriteGGUF(out, l.model, domain)
}

// TrainingWall is the wall-clock bound of a training with threads
// threads under a CPU-time budget: budget/threads, since each of the
// trainer's goroutines uses at most one core (threads 0 or above
// GOMAXPROCS count as GOMAXPROCS, lora.Options' default and Go's cap).
func TrainingWall(budget time.Duration, threads int) time.Duration {
	if p := runtime.GOMAXPROCS(0); threads <= 0 || threads > p {
		threads = p
	}
	return budget / time.Duration(threads)
}

// external runs the external trainer on the set's JSONL.
func (l *Loop) external(ctx context.Context, set registry.CuratedSet, out string) error {
	dir, err := os.MkdirTemp(l.cfg.Dir, "external-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	paths := map[string]string{registry.SplitTrain: filepath.Join(dir, "train.jsonl"), registry.SplitHeldOut: filepath.Join(dir, "heldout.jsonl")}
	for split, p := range paths {
		f, err := os.Create(p)
		if err != nil {
			return err
		}
		if _, err := curate.WriteJSONL(f, set, split); err != nil {
			f.Close()
			return err
		}
		if err := f.Close(); err != nil {
			return err
		}
	}
	return RunExternal(ctx, l.cfg.ExternalTrainer, map[string]string{
		"train": paths[registry.SplitTrain], "heldout": paths[registry.SplitHeldOut], "base": l.d.BaseModel, "out": out,
		"rank": strconv.Itoa(l.cfg.Rank), "steps": strconv.Itoa(l.cfg.Steps)}, l.cfg.Budget)
}

// RunExternal runs argv with {name} placeholders replaced from vars,
// bounded by budget, and checks that it wrote vars["out"]. Errors: the
// command fails (its last output lines are in the error), times out, or
// writes no file.
func RunExternal(ctx context.Context, argv []string, vars map[string]string, budget time.Duration) error {
	if len(argv) == 0 {
		return errors.New("external_trainer: no command")
	}
	args := make([]string, len(argv))
	for i, a := range argv {
		for k, v := range vars {
			a = strings.ReplaceAll(a, "{"+k+"}", v)
		}
		args[i] = a
	}
	if budget > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, budget)
		defer cancel()
	}
	cmd := exec.CommandContext(ctx, args[0], args[1:]...)
	outb, err := cmd.CombinedOutput()
	if err != nil {
		tail := string(outb)
		if len(tail) > 2000 {
			tail = tail[len(tail)-2000:]
		}
		return fmt.Errorf("external_trainer %s: %w: %s", filepath.Base(args[0]), err, strings.TrimSpace(tail))
	}
	if st, err := os.Stat(vars["out"]); err != nil || st.Size() == 0 {
		return fmt.Errorf("external_trainer %s exited without writing the adapter %s", filepath.Base(args[0]), vars["out"])
	}
	return nil
}

// evaluate scores version v against the incumbent of domain (the version
// its alias serves, else the base) on the held-out pairs, and against the
// base on the general probes, and applies the gate.
func (l *Loop) evaluate(ctx context.Context, ev *eval.Evaluator, domain string, v registry.AdapterVersion, held []eval.Pair) (adapters.Evaluation, error) {
	heldEx, err := ev.EncodeAll(held)
	if err != nil {
		return adapters.Evaluation{}, err
	}
	genEx, err := ev.EncodeAll(eval.GeneralProbes())
	if err != nil {
		return adapters.Evaluation{}, err
	}
	incumbent := ""
	aliases, err := l.d.Registry.Aliases(ctx)
	if err != nil {
		return adapters.Evaluation{}, err
	}
	if cur, ok := aliases[domain]; ok {
		if iv, err := l.d.Registry.AdapterVersion(ctx, cur); err == nil {
			incumbent = iv.Path
		}
	}
	var s eval.Scores
	if s.IncumbentDomain, err = ev.NLL(incumbent, heldEx, true); err != nil {
		return adapters.Evaluation{}, err
	}
	if s.CandidateDomain, err = ev.NLL(v.Path, heldEx, true); err != nil {
		return adapters.Evaluation{}, err
	}
	if s.BaseGeneral, err = ev.NLL("", genEx, false); err != nil {
		return adapters.Evaluation{}, err
	}
	if s.CandidateGen, err = ev.NLL(v.Path, genEx, false); err != nil {
		return adapters.Evaluation{}, err
	}
	return adapters.Evaluation{Scores: s, Verdict: l.cfg.Gate.Judge(s), Quality: s.CandidateDomain.Quality(), HeldOut: len(heldEx), Category: domain}, nil
}

func mustJSON(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

// Start runs cycles on the schedule (Every or At) until Stop; without a
// schedule it does nothing.
func (l *Loop) Start() {
	if l.cfg.Every <= 0 && l.cfg.At == "" {
		return
	}
	l.stop, l.done = make(chan struct{}), make(chan struct{})
	go func() {
		defer close(l.done)
		for {
			t := time.NewTimer(l.next(time.Now()))
			select {
			case <-l.stop:
				t.Stop()
				return
			case <-t.C:
			}
			ctx, cancel := context.WithCancel(context.Background())
			go func() {
				select {
				case <-l.stop:
					cancel()
				case <-ctx.Done():
				}
			}()
			rep, err := l.RunOnce(ctx)
			cancel()
			if err != nil && !errors.Is(err, ErrBusy) {
				l.d.Logger.Warn("specialisation cycle failed", zap.Error(err))
			} else if err == nil {
				l.d.Logger.Info("specialisation cycle", zap.Int("domains", len(rep.Domains)), zap.Duration("took", rep.Finished.Sub(rep.Started)))
			}
		}
	}()
}

// next is the wait before the next scheduled cycle from now.
func (l *Loop) next(now time.Time) time.Duration {
	if l.cfg.Every > 0 {
		return l.cfg.Every
	}
	at, _ := time.Parse("15:04", l.cfg.At)
	t := time.Date(now.Year(), now.Month(), now.Day(), at.Hour(), at.Minute(), 0, 0, now.Location())
	if !t.After(now) {
		t = t.AddDate(0, 0, 1)
	}
	return t.Sub(now)
}

// Stop ends the schedule and interrupts a running cycle (its training is
// checkpointed; the serving adapters are untouched).
func (l *Loop) Stop() {
	if l.stop == nil {
		return
	}
	close(l.stop)
	<-l.done
	l.stop = nil
}
