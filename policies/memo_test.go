package policies

import (
	"context"
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/open-policy-agent/opa/v1/ast"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
)

// memoCorpus is route inputs over what the default policy reads: every
// class (and an unknown one), findings, identities scoped to tiers, models
// and tools, opaque and unscanned content, failed scans, residency, the
// models listing, and tool rounds with parents of every class.
func memoCorpus() []Input {
	classes := []string{"public", "internal", "confidential", "restricted", "secret"}
	findings := []map[string]any{{}, {"EMAIL": 1}, {"EMAIL": 2, "PHONE": 1, "SECRET": 1}}
	ids := []map[string]any{
		{"member": "anonymous", "scopes": []any{}},
		{"member": "alice", "scopes": []any{"tier:T0", "tier:T3"}, "models": []any{}, "tiers": []any{"T0", "T3"}, "tools": []any{}},
		{"member": "bob", "scopes": []any{"model:gpt*"}, "models": []any{"gpt*"}, "tiers": []any{}, "tools": []any{"f"}, "remaining_usd": 2.5},
		{"member": "carol", "scopes": []any{"model:chat"}, "models": []any{"chat"}, "tiers": []any{}, "tools": []any{}},
	}
	targets := []any{
		map[string]any{"name": "device", "tier": "T0", "kind": "engine", "region": "local", "models": []any{"chat", "gpt-mini"}, "price_in": 0, "price_out": 0},
		map[string]any{"name": "cloud", "tier": "T3", "kind": "openai", "region": "EU", "models": []any{"gpt-4o"}, "price_in": 2.5, "price_out": 10},
	}
	var out []Input
	n := 0
	for _, class := range classes {
		for fi, f := range findings {
			for ii, id := range ids {
				n++
				m := members(class, f)
				sov := m["sovereignty"].(map[string]any)
				req := m["request"].(map[string]any)
				switch n % 6 {
				case 1:
					sov["opaque"] = true
				case 2:
					sov["unscanned"] = []any{map[string]any{"path": "messages.0.content.1.image_url.url", "reason": "binary image/png data URL"}}
				case 3:
					sov["scan_failed"] = true
				case 4:
					sov["residency"] = "EU"
				case 5:
					req["endpoint"] = "models"
				}
				if (fi+ii)%2 == 1 {
					req["tools"] = []any{"f", "g"}
				}
				in := Input{Subject: newSubject(m), Identity: id, Targets: targets}
				out = append(out, in)
				if n%4 == 0 {
					parent := classes[(n/4)%len(classes)]
					out = append(out, Input{Subject: newSubject(m), Identity: id, Targets: targets,
						Derived: map[string]any{"kind": "tool_round", "parent": map[string]any{"decision_id": "d-1", "sensitivity": parent, "findings": f}}})
				}
			}
		}
	}
	return out
}

// decisionView is everything a Decision says, but its id.
func decisionView(d *Decision) map[string]any {
	out := map[string]any{"allow": d.Allowed(), "code": d.Code(), "tiers": d.Tiers(), "sensitivity": d.Sensitivity(),
		"regions": d.Regions(), "reasons": d.Reasons(), "revision": d.Revision(), "detail": d.detail}
	if c, ok := d.MaxCostUSD(); ok {
		out["max_cost"] = c
	}
	if ms, ok := d.Models(); ok {
		out["models"] = ms
	}
	for _, t := range Tiers {
		out["redact "+t] = d.Redact(t)
		out["output "+t] = d.Output(t)
	}
	return out
}

func TestMemoizedDecisionsAreTheEvaluatedOnes(t *testing.T) {
	ctx := context.Background()
	core, logs := observer.New(zap.InfoLevel)
	memo, err := New(ctx, Options{Logger: zap.New(core)})
	if err != nil {
		t.Fatal(err)
	}
	fresh, err := New(ctx, Options{MemoSize: -1})
	if err != nil {
		t.Fatal(err)
	}
	if memo.rev.Load().memo == nil || fresh.rev.Load().memo != nil {
		t.Fatal("the default policy should be memoised (and MemoSize -1 should turn the memo off)")
	}
	corpus := memoCorpus()
	for round := range 2 {
		for i, in := range corpus {
			want := fresh.Decide(ctx, in).Decision()
			got := memo.Decide(ctx, in).Decision()
			if !reflect.DeepEqual(decisionView(got), decisionView(want)) {
				t.Fatalf("round %d input %d: memoised decision\n%v\nevaluated\n%v", round, i, decisionView(got), decisionView(want))
			}
			if got.ID() == want.ID() || len(got.ID()) != 36 {
				t.Fatalf("decision ids %q, %q: each decision has its own", got.ID(), want.ID())
			}
		}
	}
	hits := logs.FilterField(zap.Bool("memoized", true)).Len()
	if hits < len(corpus) {
		t.Fatalf("%d memoised decisions over two rounds of %d inputs; the second round should all be", hits, len(corpus))
	}
}

// memoEngines loads a one-file policy directory holding rego twice: with
// the memo, and without (the oracle).
func memoEngines(t *testing.T, rego string) (memo, fresh *Engine) {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "p.rego"), []byte(rego), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, e := range []struct {
		into *(*Engine)
		size int
	}{{&memo, 0}, {&fresh, -1}} {
		eng, err := New(context.Background(), Options{Dir: dir, MemoSize: e.size})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { eng.Close() })
		*e.into = eng
	}
	return memo, fresh
}

// sameDecisions fails t unless memo and fresh decide every input alike, in
// order, twice (the second time from the memo where it applies).
func sameDecisions(t *testing.T, memo, fresh *Engine, ins ...Input) {
	t.Helper()
	ctx := context.Background()
	for round := range 2 {
		for i, in := range ins {
			got, want := memo.Decide(ctx, in).Decision(), fresh.Decide(ctx, in).Decision()
			if !reflect.DeepEqual(decisionView(got), decisionView(want)) {
				t.Fatalf("round %d input %d: memoised %v, evaluated %v", round, i, decisionView(got), decisionView(want))
			}
		}
	}
}

func TestTheMemoKeysWhatThePolicyReads(t *testing.T) {
	withTokens := func(n any) Input {
		m := members("public", map[string]any{})
		m["capability"].(map[string]any)["prompt_tokens"] = n
		return Input{Subject: newSubject(m)}
	}
	wholeInput := func(t *testing.T, e *Engine) {
		t.Helper()
		if m := e.rev.Load().memo; m == nil || len(m.paths) != 1 || len(m.paths[0]) != 0 {
			t.Fatalf("memo %v, want one keyed by the whole input", m)
		}
	}
	t.Run("the default policy does not read the capability", func(t *testing.T) {
		m := defaultEngine(t).rev.Load().memo
		if m == nil {
			t.Fatal("no memo for the default policy")
		}
		for _, p := range m.paths {
			if len(p) == 0 || p[0].Equal(ast.StringTerm("capability")) {
				t.Fatalf("memo paths %v hold %v", m.paths, p)
			}
		}
	})
	t.Run("a policy reading the prompt size is keyed by it", func(t *testing.T) {
		memo, fresh := memoEngines(t, `package molly.policy
import rego.v1
decision := {"allow": true, "tiers": ["T0"], "reasons": [sprintf("%v tokens", [input.capability.prompt_tokens])]}
`)
		sameDecisions(t, memo, fresh, withTokens(10), withTokens(20), withTokens(20.5), withTokens("20"), withTokens(ast.Number("3")), withTokens(ast.Number("3.0")))
	})
	t.Run("a policy reading only other parts is not keyed by the prompt size", func(t *testing.T) {
		memo, fresh := memoEngines(t, `package molly.policy
import rego.v1
decision := {"allow": true, "tiers": ["T0"], "reasons": [input.sovereignty.sensitivity]}
tool_decision := {"allow": true, "reasons": [sprintf("%v", [input])]}
`)
		if m := memo.rev.Load().memo; m == nil || len(m.paths) != 1 || len(m.paths[0]) != 2 {
			t.Fatalf("memo %v, want one keyed by sovereignty.sensitivity (tool_decision's whole input is another query's)", m)
		}
		sameDecisions(t, memo, fresh, withTokens(10), withTokens(20))
	})
	t.Run("a policy reading input by a computed key is keyed by the whole input", func(t *testing.T) {
		memo, fresh := memoEngines(t, `package molly.policy
import rego.v1
k := "capability"
decision := {"allow": true, "tiers": ["T0"], "reasons": [sprintf("%v", [input[k].prompt_tokens])]}
`)
		wholeInput(t, memo)
		sameDecisions(t, memo, fresh, withTokens(1), withTokens(2))
	})
	t.Run("a policy passing input to a function is keyed by the whole input", func(t *testing.T) {
		memo, fresh := memoEngines(t, `package molly.policy
import rego.v1
size(x) := x.capability.prompt_tokens
decision := {"allow": true, "tiers": ["T0"], "reasons": [sprintf("%v", [size(input)])]}
`)
		wholeInput(t, memo)
		sameDecisions(t, memo, fresh, withTokens(1), withTokens(2))
	})
	t.Run("a policy reading input through a rule it depends on is keyed by it", func(t *testing.T) {
		memo, fresh := memoEngines(t, `package molly.policy
import rego.v1
big if input.capability.prompt_tokens > 15
tiers := ["T0"] if big else := ["T0", "T1"]
decision := {"allow": true, "tiers": tiers, "reasons": []}
`)
		sameDecisions(t, memo, fresh, withTokens(10), withTokens(20), withTokens(10))
	})
	t.Run("a policy calling a non-deterministic builtin is not memoised", func(t *testing.T) {
		memo, _ := memoEngines(t, `package molly.policy
import rego.v1
decision := {"allow": true, "tiers": ["T0"], "reasons": [sprintf("%d", [time.now_ns()])]}
`)
		if memo.rev.Load().memo != nil {
			t.Fatal("time.now_ns() is not deterministic, yet the revision has a memo")
		}
		ctx := context.Background()
		a := memo.Decide(ctx, withTokens(1)).Decision().Reasons()
		b := memo.Decide(ctx, withTokens(1)).Decision().Reasons()
		if a[0] == b[0] {
			t.Fatalf("two decisions at different times gave the same time %s", a[0])
		}
	})
}

// BenchmarkDecideMemo is a route decision on the default policy answered by
// the memo, next to the same decision evaluated (MemoSize -1), in one run;
// with the decision log encoded as JSON (to io.Discard), and without a
// log, which shows what the log line costs.
func BenchmarkDecideMemo(b *testing.B) {
	ctx := context.Background()
	m, id, targets := typical()
	v, err := ValueOf(m)
	if err != nil {
		b.Fatal(err)
	}
	converted := make([]any, len(targets))
	for i, t := range targets {
		if converted[i], err = ValueOf(t); err != nil {
			b.Fatal(err)
		}
	}
	in := Input{Subject: valueSubject{subject: newSubject(m), v: v}, Identity: id, Targets: converted}
	// As the pipeline passes it: the subject's members, the identity and
	// the targets converted once.
	idv, err := ValueOf(id)
	if err != nil {
		b.Fatal(err)
	}
	o := v.(ast.Object)
	pipeline := Input{Subject: memberSubject{valueSubject: valueSubject{subject: newSubject(m), v: v},
		req: o.Get(keyRequest), capability: o.Get(keyCapability), sov: o.Get(keySovereignty)}, Identity: idv, Targets: converted}
	for _, c := range []struct {
		name string
		size int
		log  *zap.Logger
		in   Input
	}{
		{"baseline/evaluated+json-log", -1, discardLogger(), in}, {"memoised+json-log", 0, discardLogger(), in}, {"memoised", 0, zap.NewNop(), in},
		{"pipeline/evaluated+json-log", -1, discardLogger(), pipeline}, {"pipeline/memoised+json-log", 0, discardLogger(), pipeline},
		{"pipeline/memoised", 0, zap.NewNop(), pipeline},
	} {
		b.Run(c.name, func(b *testing.B) {
			e, err := New(ctx, Options{MemoSize: c.size, Logger: c.log})
			if err != nil {
				b.Fatal(err)
			}
			if d := e.Decide(ctx, c.in).Decision(); !d.Allowed() {
				b.Fatalf("denied: %v", d.Reasons())
			}
			loop(b, func() { e.Decide(ctx, c.in) })
		})
	}
}
