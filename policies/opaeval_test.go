package policies

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"sync"
	"testing"

	opacmd "github.com/open-policy-agent/opa/cmd"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// logBuffer collects the JSON lines a production-shaped zap logger writes.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *logBuffer) Sync() error { return nil }

// decisions returns the logged "policy decision" lines, decoded.
func (l *logBuffer) decisions(t *testing.T) []map[string]any {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []map[string]any
	sc := bufio.NewScanner(bytes.NewReader(l.buf.Bytes()))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var m map[string]any
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			t.Fatalf("log line %q: %v", sc.Text(), err)
		}
		if m["msg"] == "policy decision" {
			out = append(out, m)
		}
	}
	return out
}

func jsonLogger(w *logBuffer) *zap.Logger {
	return zap.New(zapcore.NewCore(zapcore.NewJSONEncoder(zap.NewProductionEncoderConfig()), w, zap.InfoLevel))
}

// opaEval runs the real `opa eval` (OPA's own command, in process) on a
// logged input and returns the value of query, or nil when undefined.
func opaEval(t *testing.T, dir string, input any, query string) any {
	t.Helper()
	in := filepath.Join(t.TempDir(), "input.json")
	b, err := json.Marshal(input)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(in, b, 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := os.CreateTemp(t.TempDir(), "opa-out")
	if err != nil {
		t.Fatal(err)
	}
	stdout := os.Stdout
	os.Stdout = out // opa eval writes its result to os.Stdout
	root := opacmd.Command(nil, "OPA")
	root.SetArgs([]string{"eval", "--format", "json", "--ignore", ".*", "--ignore", "*_test.rego", "-d", dir, "-i", in, query})
	err = root.Execute()
	os.Stdout = stdout
	if err != nil {
		t.Fatalf("opa eval: %v", err)
	}
	res, err := os.ReadFile(out.Name())
	if err != nil {
		t.Fatal(err)
	}
	var got struct {
		Result []struct {
			Expressions []struct {
				Value any `json:"value"`
			} `json:"expressions"`
		} `json:"result"`
	}
	if err := json.Unmarshal(res, &got); err != nil {
		t.Fatalf("opa eval output %s: %v", res, err)
	}
	if len(got.Result) == 0 {
		return nil
	}
	return got.Result[0].Expressions[0].Value
}

// checkAgainstOPA asserts that every logged decision has OPA's decision-log
// fields and that `opa eval` on its input gives its result.
func checkAgainstOPA(t *testing.T, dir string, lines []map[string]any, revision string) {
	t.Helper()
	for _, l := range lines {
		for _, k := range []string{"decision_id", "path", "input", "revision", "timestamp", "metrics"} {
			if _, ok := l[k]; !ok {
				t.Fatalf("log line %v lacks %q", l, k)
			}
		}
		if l["revision"] != revision {
			t.Fatalf("logged revision %v, want %s", l["revision"], revision)
		}
		if _, ok := l["metrics"].(map[string]any)["timer_rego_query_eval_ns"]; !ok {
			t.Fatalf("metrics %v lack timer_rego_query_eval_ns", l["metrics"])
		}
		query := "data." + filepath.ToSlash(l["path"].(string))
		query = string(bytes.ReplaceAll([]byte(query), []byte("/"), []byte(".")))
		want := opaEval(t, dir, l["input"], query)
		if want == nil {
			t.Fatalf("%s is undefined for the logged input %v", query, l["input"])
		}
		if !reflect.DeepEqual(l["result"], want) {
			t.Errorf("%s: Molly logged %v, opa eval gives %v", query, l["result"], want)
		}
	}
}

func TestLoggedDecisionsMatchOpaEval(t *testing.T) {
	if testing.Short() {
		t.Skip("runs opa eval once per decision; skipped with -short")
	}
	dir := t.TempDir()
	copyDefaults(t, dir, "residency.rego", "redaction.rego", "tools.rego", "escalation.rego")
	var logs logBuffer
	e, err := New(context.Background(), Options{Dir: dir, Logger: jsonLogger(&logs)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Close() })
	ctx := context.Background()
	targets := []any{map[string]any{"name": "cloud", "tier": "T3", "kind": "openai", "region": "EU", "models": []string{"gpt-4o"}, "price_in": 2.5, "price_out": 10}}
	scoped := map[string]any{"member": "alice", "scopes": []string{"model:chat"}, "models": []string{"chat"}, "tiers": []string{"T0", "T1", "T3"}, "tools": []string{}, "remaining_usd": 4.25}
	opaque := members("internal", map[string]any{"EMAIL": 2})
	opaque["sovereignty"].(map[string]any)["unscanned"] = []any{map[string]any{"path": "messages.0.content.1.image_url.url", "reason": "image"}}
	gpt := members("public", nil)
	gpt["request"] = map[string]any{"endpoint": "chat.completions", "model": "gpt-4o", "stream": true}
	e.Decide(ctx, Input{Subject: newSubject(members("public", map[string]any{"EMAIL": 1, "PHONE": 1})), Identity: scoped, Targets: targets})
	e.Decide(ctx, Input{Subject: newSubject(opaque), Identity: scoped, Targets: targets})
	e.Decide(ctx, Input{Subject: newSubject(gpt), Identity: scoped})
	e.Decide(ctx, Input{Subject: newSubject(members("confidential", map[string]any{"IBAN": 1})), Derived: map[string]any{
		"kind": "tool_round", "parent": map[string]any{"decision_id": "x", "sensitivity": "public", "findings": map[string]int{}}}})
	e.DecideTool(ctx, toolInput("money", "T1", 5000))
	e.DecideToolOffer(ctx, map[string]any{"tool": map[string]any{"name": "support", "side_effect": "write"}, "identity": scoped, "tier": "T3"})
	e.DecideEscalation(ctx, escalationInput("logprob", -2.5, 1, []any{map[string]any{"target": "cloud", "tier": "T3"}}))
	lines := logs.decisions(t)
	if testing.Verbose() {
		t.Logf("first logged decision: %v", lines[0])
	}
	if len(lines) != 7 {
		t.Fatalf("%d decisions logged, want 7", len(lines))
	}
	checkAgainstOPA(t, dir, lines, e.Status().Revision)
}

func TestMollyAndOpaEvalAgreeWithDataDocuments(t *testing.T) {
	if testing.Short() {
		t.Skip("runs opa eval; skipped with -short")
	}
	dir := t.TempDir()
	copyDefaults(t, dir, "residency.rego", "redaction.rego", "tools.rego", "escalation.rego")
	// An operator opts T2 in for content that cannot be scanned, and offers
	// tools to T3, with data only.
	if err := os.MkdirAll(filepath.Join(dir, "molly", "config"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "molly", "config", "data.json"), []byte(`{"opaque_tiers": ["T2"], "tool_offer_tiers": ["T3"]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	var logs logBuffer
	e, err := New(context.Background(), Options{Dir: dir, Logger: jsonLogger(&logs)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Close() })
	tokens := members("public", nil)
	tokens["sovereignty"].(map[string]any)["opaque"] = true
	d := e.Decide(context.Background(), Input{Subject: newSubject(tokens)}).Decision()
	o := e.DecideToolOffer(context.Background(), map[string]any{"tool": map[string]any{"name": "support", "side_effect": "write"},
		"identity": map[string]any{"member": "alice"}, "tier": "T3"})
	lines := logs.decisions(t)
	checkAgainstOPA(t, dir, lines, e.Status().Revision)
	// And what the data says took effect (not merely that both agree).
	if got := d.Tiers(); !reflect.DeepEqual(got, []string{"T0", "T1", "T2"}) || !o.Allow {
		t.Fatalf("opaque tiers %v, offer to T3 %v: the data documents were not applied", got, o.Allow)
	}
}
