package policies

import (
	"context"
	"io"
	"maps"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"testing"

	"github.com/open-policy-agent/opa/v1/rego"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// typical is a route decision's input as the gateway builds it: a public
// chat request with two findings, a scoped member, four targets.
func typical() (map[string]any, map[string]any, []any) {
	m := members("public", map[string]any{"EMAIL": 1, "PHONE": 2})
	id := map[string]any{"member": "alice", "scopes": []any{"model:chat", "tier:T0", "tier:T1", "tier:T3"},
		"models": []any{"chat"}, "tiers": []any{"T0", "T1", "T3"}, "tools": []any{}, "remaining_usd": 4.25}
	var targets []any
	for _, t := range []struct{ name, tier, region string }{{"device", "T0", "local"}, {"lan", "T1", "local"}, {"dc", "T2", "EU"}, {"cloud", "T3", "EU"}} {
		targets = append(targets, map[string]any{"name": t.name, "tier": t.tier, "kind": "openai", "region": t.region,
			"models": []any{"chat"}, "price_in": 0.5, "price_out": 1.5})
	}
	return m, id, targets
}

func discardLogger() *zap.Logger {
	return zap.New(zapcore.NewCore(zapcore.NewJSONEncoder(zap.NewProductionEncoderConfig()), zapcore.AddSync(io.Discard), zap.InfoLevel))
}

// BenchmarkDecide measures one route decision on the default policy.
// baseline/* is the previous implementation's path, measured in the same
// run: the input as Go maps passed with rego.EvalInput (which round-trips it
// through JSON), a context.WithTimeout per evaluation (and rego's goroutine
// watching it), a metrics registry per evaluation, and the input logged
// with zap.Any (reflection JSON). The others are Decide: input built as an
// ast.Value (from the Subject's maps, or its PolicyValue), rego's external
// cancel and no-op metrics, a CPU-time watchdog, and the input logged by
// walking the ast.
func BenchmarkDecide(b *testing.B) {
	ctx := context.Background()
	m, id, targets := typical()

	b.Run("baseline/map-input", func(b *testing.B) { benchOld(b, zap.NewNop()) })
	b.Run("baseline/map-input+json-log", func(b *testing.B) { benchOld(b, discardLogger()) })

	newEngine := func(b *testing.B, log *zap.Logger) *Engine {
		e, err := New(ctx, Options{Logger: log})
		if err != nil {
			b.Fatal(err)
		}
		return e
	}
	run := func(b *testing.B, e *Engine, in Input) {
		if d := e.Decide(ctx, in).Decision(); !d.Allowed() {
			b.Fatalf("denied: %v", d.Reasons())
		}
		loop(b, func() { e.Decide(ctx, in) })
	}
	v, err := ValueOf(m)
	if err != nil {
		b.Fatal(err)
	}
	vs := valueSubject{subject: newSubject(m), v: v}
	b.Run("subject-maps", func(b *testing.B) {
		run(b, newEngine(b, zap.NewNop()), Input{Subject: newSubject(m), Identity: id, Targets: targets})
	})
	b.Run("subject-value", func(b *testing.B) {
		run(b, newEngine(b, zap.NewNop()), Input{Subject: vs, Identity: id, Targets: targets})
	})
	b.Run("subject-value+json-log", func(b *testing.B) {
		run(b, newEngine(b, discardLogger()), Input{Subject: vs, Identity: id, Targets: targets})
	})
	// The catalogue's targets converted once (ValueOf), as the pipeline
	// keeps them: only the identity is converted per request.
	converted := make([]any, len(targets))
	for i, t := range targets {
		if converted[i], err = ValueOf(t); err != nil {
			b.Fatal(err)
		}
	}
	b.Run("subject-value+targets-value", func(b *testing.B) {
		run(b, newEngine(b, zap.NewNop()), Input{Subject: vs, Identity: id, Targets: converted})
	})
	b.Run("subject-value+targets-value+json-log", func(b *testing.B) {
		run(b, newEngine(b, discardLogger()), Input{Subject: vs, Identity: id, Targets: converted})
	})
	// OPA's floor on this machine: a policy whose decision is a constant.
	b.Run("floor/constant-policy", func(b *testing.B) {
		dir := b.TempDir()
		if err := os.WriteFile(filepath.Join(dir, "p.rego"), []byte(allow("constant")), 0o644); err != nil {
			b.Fatal(err)
		}
		e, err := New(ctx, Options{Dir: dir})
		if err != nil {
			b.Fatal(err)
		}
		defer e.Close()
		run(b, e, Input{Subject: vs, Identity: id, Targets: converted})
	})
	// The same, rego alone: what the CPU-time watchdog, the id, the input
	// object and the parsing add on top of OPA.
	b.Run("floor/constant-policy-rego-only", func(b *testing.B) {
		dir := b.TempDir()
		if err := os.WriteFile(filepath.Join(dir, "p.rego"), []byte(allow("constant")), 0o644); err != nil {
			b.Fatal(err)
		}
		e, err := New(ctx, Options{Dir: dir})
		if err != nil {
			b.Fatal(err)
		}
		defer e.Close()
		in, err := routeInput(Input{Subject: vs, Identity: id, Targets: converted})
		if err != nil {
			b.Fatal(err)
		}
		q := &e.rev.Load().decision
		loop(b, func() { _, _ = q.Eval(ctx, rego.EvalParsedInput(in), rego.EvalMetrics(noMetrics)) })
	})
}

// loop runs f b.N times on one locked OS thread and reports, besides
// ns/op, the thread's CPU time per op (cpu-ns/op): what one decision costs
// the machine, unaffected by time spent waiting for a CPU on a shared box.
func loop(b *testing.B, f func()) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	clk, ok := currentThreadClock()
	c0, ok0 := clk.now()
	b.ReportAllocs()
	for b.Loop() {
		f()
	}
	if c1, ok1 := clk.now(); ok && ok0 && ok1 {
		b.ReportMetric(float64(c1-c0)/float64(b.N), "cpu-ns/op")
	}
}

// benchOld is the previous Decide: rego.Module per file compiled by
// PrepareForEval, rego.EvalInput(map) under context.WithTimeout.
func benchOld(b *testing.B, log *zap.Logger) {
	ctx := context.Background()
	m, id, targets := typical()
	input := maps.Clone(m)
	input["identity"], input["targets"] = id, targets
	opts := []func(*rego.Rego){rego.Query(DefaultQuery), rego.StrictBuiltinErrors(true)}
	names := []string{"residency.rego", "redaction.rego", "tools.rego", "escalation.rego"}
	sort.Strings(names)
	for _, n := range names {
		src, err := Default.ReadFile(n)
		if err != nil {
			b.Fatal(err)
		}
		opts = append(opts, rego.Module(n, string(src)))
	}
	pq, err := rego.New(opts...).PrepareForEval(ctx)
	if err != nil {
		b.Fatal(err)
	}
	decide := func() *Decision {
		ctx, cancel := context.WithTimeout(ctx, DefaultTimeout)
		defer cancel()
		rs, err := pq.Eval(ctx, rego.EvalInput(input))
		if err != nil || len(rs) == 0 {
			b.Fatalf("eval: %v", err)
		}
		d, err := parseDecision(rs[0].Expressions[0].Value)
		if err != nil {
			b.Fatal(err)
		}
		d.id = newID()
		log.Info("policy decision", zap.String("decision_id", d.id), zap.String("path", "molly/policy/decision"),
			zap.Any("input", input), zap.Any("result", rs[0].Expressions[0].Value))
		return d
	}
	if d := decide(); !d.Allowed() {
		b.Fatalf("denied: %v", d.Reasons())
	}
	loop(b, func() { decide() })
}
