package specialise

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/molly-gateway/molly/learning/eval"
	"github.com/molly-gateway/molly/registry"
	"github.com/molly-gateway/molly/serving"
	"github.com/molly-gateway/molly/serving/llama"
)

// fixture is a registry and the tiny demo base in a temporary folder.
type fixture struct {
	reg   *registry.Registry
	model string
	dir   string
}

func newFixture(t testing.TB) *fixture {
	t.Helper()
	dir := t.TempDir()
	if err := serving.WriteDemo(dir, 1, "tiny"); err != nil {
		t.Fatal(err)
	}
	reg, err := registry.Open(filepath.Join(dir, "molly.db"), registry.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { reg.Close() })
	return &fixture{reg: reg, model: filepath.Join(dir, serving.DemoModelFile), dir: dir}
}

// Arithmetic word problems answered in one template by a T1 teacher: the
// domain the tests specialise in.
func problem(i int) (string, string) {
	a, b := 2+i%17, 3+(i*7)%13
	return fmt.Sprintf("Sam has %d apples and buys %d more. How many apples now?", a, b),
		fmt.Sprintf("Sam has %d + %d = %d apples.", a, b, a+b)
}

func chatBody(prompt string) string {
	b, _ := json.Marshal(map[string]any{"model": "chat", "messages": []map[string]string{{"role": "user", "content": prompt}}})
	return string(b)
}

// putTraces stores n math traces of member, answered by T1.
func (f *fixture) putTraces(t testing.TB, member string, from, n int) {
	t.Helper()
	var ts []registry.Trace
	for i := from; i < from+n; i++ {
		q, a := problem(i)
		ts = append(ts, registry.Trace{DecisionID: fmt.Sprintf("d-%s-%d", member, i), Member: member, Category: "math", Model: "chat",
			Label: "routed", Tier: "T1", Target: "lan", ServedModel: "small-lan", Request: chatBody(q), Answer: a, Feedback: -1})
	}
	if _, err := f.reg.PutTraces(context.Background(), ts); err != nil {
		t.Fatal(err)
	}
}

func (f *fixture) loop(t testing.TB, cfg Config) *Loop {
	t.Helper()
	if cfg.Dir == "" {
		cfg.Dir = filepath.Join(f.dir, "specialise")
	}
	l, err := New(cfg, Deps{Registry: f.reg, BaseModel: f.model, Target: "device"})
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// demoConfig is a cycle small enough for a test on two cores.
var demoConfig = Config{MinTraces: 20, Rank: 4, Steps: 40, BatchSize: 4, LR: 2e-2, Threads: 2}

// answerNLL is the oracle: the mean NLL per answer token of a chat pair,
// from llama.cpp's logits over the engine's own chat template (the text
// the engine would be sent), with the adapter file at adapter ("" none).
func answerNLL(t *testing.T, model, adapter string, pairs [][2]string) float64 {
	t.Helper()
	m, err := llama.LoadModel(model)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	ctx, err := llama.NewContext(m, llama.ContextParams{NCtx: 512, NBatch: 512, NSeqMax: 1, Threads: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer ctx.Close()
	if adapter != "" {
		a, err := llama.LoadAdapter(m, adapter)
		if err != nil {
			t.Fatal(err)
		}
		defer a.Close()
		ctx.SetAdapters([]*llama.Adapter{a}, nil)
		defer ctx.SetAdapters(nil, nil)
	}
	var sum float64
	var n int
	for _, p := range pairs {
		prompt, err := llama.ApplyChatTemplate(m.ChatTemplate(), []llama.ChatMessage{{Role: "user", Content: p[0]}}, true)
		if err != nil {
			t.Fatal(err)
		}
		pt, err := m.Tokenize(prompt, true, true)
		if err != nil {
			t.Fatal(err)
		}
		at, err := m.Tokenize(p[1], false, false)
		if err != nil {
			t.Fatal(err)
		}
		toks := append(slices.Clone(pt), at...)
		ctx.Clear()
		b := llama.NewBatch(len(toks))
		for i, tok := range toks {
			b.Add(tok, i, 0, true)
		}
		if err := ctx.Decode(b); err != nil {
			t.Fatal(err)
		}
		for i := len(pt); i < len(toks); i++ {
			row := ctx.Logits(i-1, nil)
			mx := slices.Max(row)
			var z float64
			for _, v := range row {
				z += math.Exp(float64(v - mx))
			}
			sum += float64(mx) + math.Log(z) - float64(row[toks[i]])
			n++
		}
		b.Free()
	}
	return sum / float64(n)
}

// TestACycleTrainsEvaluatesAndPromotes: one cycle over templated T1
// answers trains an adapter that llama.cpp itself scores ≥ 10% lower on
// held-out problems, within 1% on general text, and promotes it.
func TestACycleTrainsEvaluatesAndPromotes(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	f.putTraces(t, "alice", 0, 60)
	l := f.loop(t, demoConfig)
	rep, err := l.RunOnce(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Domains) != 1 {
		t.Fatalf("report %+v", rep)
	}
	d := rep.Domains[0]
	if d.Error != "" || d.Skipped != "" || !d.Promoted || d.Version == "" {
		t.Fatalf("domain report %+v", d)
	}
	v, err := f.reg.AdapterVersion(ctx, d.Version)
	if err != nil {
		t.Fatal(err)
	}
	aliases, _ := f.reg.Aliases(ctx)
	if aliases["math"] != v.Version {
		t.Fatalf("alias math → %q, want %s", aliases["math"], v.Version)
	}
	// The oracle on problems the cycle held out (the curated set's held-out split).
	set, err := f.reg.CuratedSet(ctx, d.Set)
	if err != nil {
		t.Fatal(err)
	}
	var held [][2]string
	for _, it := range set.Items {
		if it.Split == registry.SplitHeldOut {
			var msgs []struct{ Content string }
			_ = json.Unmarshal([]byte(it.Messages), &msgs)
			held = append(held, [2]string{msgs[0].Content, it.Answer})
		}
	}
	if len(held) == 0 {
		t.Fatal("no held-out pairs")
	}
	before, after := answerNLL(t, f.model, "", held), answerNLL(t, f.model, v.Path, held)
	t.Logf("held-out NLL/token: base %.3f, adapter %.3f (%d pairs); tokens/s %.0f", before, after, len(held), d.TrainTokensPerS)
	if !(after <= 0.9*before) {
		t.Fatalf("held-out NLL %.3f with the adapter, %.3f without: under 10%% lower", after, before)
	}
	general := generalPairs(t)
	gb, ga := answerNLL(t, f.model, "", general), answerNLL(t, f.model, v.Path, general)
	t.Logf("general NLL/token: base %.3f, adapter %.3f", gb, ga)
	if ga > 1.01*gb {
		t.Fatalf("general NLL %.3f with the adapter, %.3f without: over 1%% worse", ga, gb)
	}
	// The adapter records what it learnt from: training traces only.
	on, err := f.reg.TrainedOnTraces(ctx, v.Version)
	if err != nil || len(on) != d.Curation.Train || len(on) == 0 {
		t.Fatalf("trained on %d traces (%v), curation kept %d for training", len(on), err, d.Curation.Train)
	}
	// A second cycle without new traces trains nothing.
	rep, err = l.RunOnce(ctx)
	if err != nil || len(rep.Domains) != 1 || rep.Domains[0].Skipped == "" {
		t.Fatalf("second cycle %+v %v", rep, err)
	}
}

// generalPairs reads the shipped general probes as (prompt, answer).
func generalPairs(t *testing.T) [][2]string {
	t.Helper()
	var out [][2]string
	for _, p := range eval.GeneralProbes() {
		if len(p.Messages) == 1 {
			out = append(out, [2]string{p.Messages[0].Content, p.Answer})
		}
	}
	if len(out) == 0 {
		t.Fatal("no general probes")
	}
	return out
}

// TestADeletedMemberIsNeverTrainedOnAgain: after bob is forgotten his
// traces are gone, and the next cycle's set and adapter hold only alice's.
func TestADeletedMemberIsNeverTrainedOnAgain(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	f.putTraces(t, "alice", 0, 30)
	f.putTraces(t, "bob", 100, 30)
	gone, err := f.reg.DeleteMemberTraces(ctx, "bob")
	if err != nil {
		t.Fatal(err)
	}
	if gone.Traces != 30 {
		t.Fatalf("forgot %+v, want 30 traces", gone)
	}
	if ts, _ := f.reg.Traces(ctx, registry.TraceQuery{Member: "bob"}); len(ts) != 0 {
		t.Fatalf("%d of bob's traces remain", len(ts))
	}
	cfg := demoConfig
	cfg.Steps = 4
	cfg.Gate.Margin = 1e-9 // this test is about what was trained on, not the gain
	l := f.loop(t, cfg)
	rep, err := l.RunOnce(ctx)
	if err != nil || len(rep.Domains) != 1 || rep.Domains[0].Error != "" || rep.Domains[0].Version == "" {
		t.Fatalf("cycle %+v %v", rep, err)
	}
	d := rep.Domains[0]
	set, err := f.reg.CuratedSet(ctx, d.Set)
	if err != nil {
		t.Fatal(err)
	}
	if len(set.Items) == 0 || d.NewTraces != 30 {
		t.Fatalf("set of %d items from %d new traces, want 30 of alice's", len(set.Items), d.NewTraces)
	}
	for _, it := range set.Items {
		if it.Member != "alice" {
			t.Fatalf("curated item of %q", it.Member)
		}
	}
	on, err := f.reg.TrainedOnTraces(ctx, d.Version)
	if err != nil || len(on) == 0 {
		t.Fatalf("trained on %v %v", on, err)
	}
	for _, o := range on {
		if o.Member != "alice" {
			t.Fatalf("adapter trained on a trace of %q", o.Member)
		}
	}
}

// TestAFailedCycleLeavesTheServingAdapterUntouched: a trainer that fails
// makes the domain's report an error and moves no alias.
func TestAFailedCycleLeavesTheServingAdapterUntouched(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	f.putTraces(t, "alice", 0, 30)
	cfg := demoConfig
	cfg.ExternalTrainer = []string{"false"}
	l := f.loop(t, cfg)
	rep, err := l.RunOnce(ctx)
	if err != nil || len(rep.Domains) != 1 || rep.Domains[0].Error == "" || rep.Domains[0].Promoted {
		t.Fatalf("cycle %+v %v", rep, err)
	}
	if a, _ := f.reg.Aliases(ctx); len(a) != 0 {
		t.Fatalf("aliases %v after a failed cycle", a)
	}
	// The traces are still new to the next cycle (the watermark did not move).
	cfg.ExternalTrainer = nil
	cfg.Steps = 2
	cfg.Gate.Margin = 1e-9
	rep, err = f.loop(t, cfg).RunOnce(ctx)
	if err != nil || rep.Domains[0].NewTraces != 30 {
		t.Fatalf("next cycle %+v %v", rep, err)
	}
}

// TestATrainingPastItsBudgetFailsTheDomain: the budget interrupts the
// training (checkpointed), the domain reports the error, and no alias
// moves; the traces stay new for the next cycle.
func TestATrainingPastItsBudgetFailsTheDomain(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	f.putTraces(t, "alice", 0, 30)
	cfg := demoConfig
	cfg.Steps, cfg.Budget = 1_000_000, 50*time.Millisecond
	rep, err := f.loop(t, cfg).RunOnce(ctx)
	if err != nil || len(rep.Domains) != 1 || !strings.Contains(rep.Domains[0].Error, "interrupted") || rep.Domains[0].Promoted {
		t.Fatalf("cycle %+v %v", rep, err)
	}
	if a, _ := f.reg.Aliases(ctx); len(a) != 0 {
		t.Fatalf("aliases %v", a)
	}
	if _, err := os.Stat(filepath.Join(f.dir, "specialise", "checkpoints", "math.ckpt")); err != nil {
		t.Fatalf("no checkpoint after the interruption: %v", err)
	}
}

// TestTheLoopRunsOnItsSchedule: with every set, cycles run by themselves
// until Stop, and the first one promotes.
func TestTheLoopRunsOnItsSchedule(t *testing.T) {
	f := newFixture(t)
	f.putTraces(t, "alice", 0, 40)
	cfg := demoConfig
	cfg.Every = 20 * time.Millisecond
	l := f.loop(t, cfg)
	l.Start()
	defer l.Stop()
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(20 * time.Millisecond) { // polling the condition
		if a, _ := f.reg.Aliases(context.Background()); a["math"] != "" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no scheduled cycle promoted within 60s")
		}
	}
	l.Stop()
	if _, err := l.RunOnce(context.Background()); err != nil { // the loop is free again after Stop
		t.Fatal(err)
	}
}

// TestAnExternalTrainersAdapterIsEvaluatedLikeOurs: the external
// trainer's command gets the exported JSONL and writes the adapter, which
// the cycle stores as source "external", evaluates and gates.
func TestAnExternalTrainersAdapterIsEvaluatedLikeOurs(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	f.putTraces(t, "alice", 0, 40)
	// A first cycle trains an adapter with the built-in trainer; the
	// "external trainer" then is a script that checks its JSONL and copies
	// that file, as peft or MLX would write theirs.
	rep, err := f.loop(t, demoConfig).RunOnce(ctx)
	if err != nil || !rep.Domains[0].Promoted {
		t.Fatalf("first cycle %+v %v", rep, err)
	}
	v, _ := f.reg.AdapterVersion(ctx, rep.Domains[0].Version)
	script := filepath.Join(t.TempDir(), "train.sh")
	if err := os.WriteFile(script, []byte("#!/bin/sh\nset -e\ngrep -q '\"role\":\"assistant\"' \"$1\"\ncp \"$2\" \"$3\"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := f.reg.SetMeta(ctx, watermarkKey("math"), "0"); err != nil { // the same traces count as new again
		t.Fatal(err)
	}
	cfg := demoConfig
	cfg.ExternalTrainer = []string{script, "{train}", v.Path, "{out}"}
	cfg.Dir = filepath.Join(f.dir, "specialise") // the same store
	rep, err = f.loop(t, cfg).RunOnce(ctx)
	if err != nil || len(rep.Domains) != 1 {
		t.Fatalf("external cycle %+v %v", rep, err)
	}
	d := rep.Domains[0]
	// The same file is the same version; against itself as the incumbent it gains nothing: refused.
	if d.Error != "" || d.Version != v.Version || d.Promoted || d.Evaluation == nil || d.Evaluation.Verdict.DomainGain != 0 {
		t.Fatalf("external domain report %+v", d)
	}
	events, _ := f.reg.AdapterEvents(ctx, "math")
	if len(events) != 2 || events[1].Action != "refuse" {
		t.Fatalf("events %+v", events)
	}
}

// BenchmarkCycle reports the built-in trainer's tokens/s and the time of
// one whole cycle (curate, train, evaluate, gate) over 60 fresh traces on
// the tiny demo base, each iteration on a fresh registry; the baseline in
// the same run is the part of the cycle that is not training (curation,
// evaluation by llama.cpp, bookkeeping), reported as other-s/cycle.
func BenchmarkCycle(b *testing.B) {
	ctx := context.Background()
	var tokS, otherS, cycleS float64
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		f := newFixture(b)
		f.putTraces(b, "alice", 0, 60)
		l := f.loop(b, demoConfig)
		b.StartTimer()
		t0 := time.Now()
		rep, err := l.RunOnce(ctx)
		if err != nil || len(rep.Domains) != 1 || rep.Domains[0].Error != "" {
			b.Fatalf("cycle %+v %v", rep, err)
		}
		took := time.Since(t0).Seconds()
		d := rep.Domains[0]
		tokS += d.TrainTokensPerS
		otherS += took - d.TrainSeconds
		cycleS += took
	}
	b.ReportMetric(tokS/float64(b.N), "train-tokens/s")
	b.ReportMetric(otherS/float64(b.N), "other-s/cycle")
	b.ReportMetric(cycleS/float64(b.N), "s/cycle")
}

// TestTrainingWallKeepsCPUUnderTheBudget: T threads for budget/T never
// use more than budget of CPU (values by hand).
func TestTrainingWallKeepsCPUUnderTheBudget(t *testing.T) {
	p := runtime.GOMAXPROCS(0)
	for _, tc := range []struct {
		threads int
		want    time.Duration
	}{
		{1, 10 * time.Minute},
		{p, 10 * time.Minute / time.Duration(p)},
		{0, 10 * time.Minute / time.Duration(p)},
		{p + 7, 10 * time.Minute / time.Duration(p)},
	} {
		if got := TrainingWall(10*time.Minute, tc.threads); got != tc.want {
			t.Errorf("TrainingWall(10m, %d) = %v, want %v", tc.threads, got, tc.want)
		}
	}
}
