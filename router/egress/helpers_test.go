package egress

import (
	"context"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/molly-gateway/molly/internal/policytest"
	"github.com/molly-gateway/molly/policies"
	"github.com/molly-gateway/molly/redaction"
	"github.com/molly-gateway/molly/router/classify"
	"github.com/molly-gateway/molly/router/openai"
	"github.com/molly-gateway/molly/router/route"
	"github.com/molly-gateway/molly/serving"
)

var (
	scannerOnce sync.Once
	scannerVal  *redaction.Scanner
	scannerErr  error
)

func testScanner(tb testing.TB) *redaction.Scanner {
	tb.Helper()
	scannerOnce.Do(func() { scannerVal, scannerErr = redaction.NewScanner(redaction.Config{}) })
	if scannerErr != nil {
		tb.Fatalf("NewScanner: %v", scannerErr)
	}
	return scannerVal
}

func testClassifier(tb testing.TB) *classify.Classifier {
	tb.Helper()
	return classify.New(testScanner(tb), nil)
}

func annotate(tb testing.TB, cls *classify.Classifier, ep openai.Endpoint, body string) *classify.Annotation {
	tb.Helper()
	if cls == nil {
		cls = testClassifier(tb)
	}
	a, err := cls.Classify(classify.Input{Endpoint: ep, Path: "/v1/" + strings.ReplaceAll(string(ep), ".", "/"), Body: []byte(body)})
	if err != nil {
		tb.Fatalf("Classify(%s): %v", body, err)
	}
	return a
}

func chatBody(prompt string) string {
	return `{"model":"m","messages":[{"role":"user","content":"` + prompt + `"}]}`
}

// decided is what a real policy engine whose route decision is the literal
// d decides about a: a Decided bound to a.
func decided(tb testing.TB, a *classify.Annotation, d map[string]any) policies.Decided {
	tb.Helper()
	return policytest.Literal(tb, d).Decide(context.Background(), policies.Input{Subject: a})
}

func allowTiers(tiers []string, redact map[string][]string) map[string]any {
	return policytest.Allow(tiers, redact, nil)
}

// tierTargets is one target per tier, all serving "m" (as "up-m" upstream on T3).
func tierTargets(tb testing.TB) (*Egress, map[string]*route.Target) {
	tb.Helper()
	ts := []*route.Target{
		{Name: "device", Tier: "T0", Endpoint: "http://127.0.0.1:1/v1", Models: []string{"m"}},
		{Name: "lan", Tier: "T1", Endpoint: "http://127.0.0.1:2/v1", Models: []string{"m"}},
		{Name: "remote", Tier: "T2", Endpoint: "http://127.0.0.1:3/v1", Models: []string{"m"}, Region: "EU"},
		{Name: "cloud", Tier: "T3", Endpoint: "http://127.0.0.1:4/v1", Models: []string{"m=up-m"}, Region: "US"},
	}
	return newEgress(tb, ts, nil), byTier(ts)
}

func byTier(ts []*route.Target) map[string]*route.Target {
	out := map[string]*route.Target{}
	for _, tg := range ts {
		out[tg.Tier] = tg
	}
	return out
}

// newEgress provisions ts (kind engine ones on eng, which may be nil when
// there are none) and makes their clients.
func newEgress(tb testing.TB, ts []*route.Target, eng *serving.Engine) *Egress {
	tb.Helper()
	var (
		models  route.Engine
		handler http.Handler
	)
	if eng != nil {
		models, handler = eng, eng
	}
	cat, err := route.NewCatalogue(ts, models)
	if err != nil {
		tb.Fatalf("NewCatalogue: %v", err)
	}
	e, err := New(cat, handler)
	if err != nil {
		tb.Fatalf("egress.New: %v", err)
	}
	tb.Cleanup(e.Close)
	return e
}

// demoEngine is the real T0 engine on the generated demo model.
func demoEngine(tb testing.TB) *serving.Engine {
	tb.Helper()
	dir := tb.TempDir()
	if err := serving.WriteDemo(dir, 1, "tiny"); err != nil {
		tb.Fatal(err)
	}
	cfg := serving.DemoConfig(dir)
	cfg.NSeqMax, cfg.NCtx, cfg.Threads = 1, 1024, 1
	e, err := serving.New(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { e.Close() })
	return e
}
