package pipeline

// The residency canary fuzz: canary values — a user-defined
// pattern type and a known test card number — are planted at random
// positions and in random shapes of valid OpenAI bodies
// (internal/canarytest), the bodies go through the real classifier, the
// real OPA policy and the real pipeline under every strategy, and the
// oracle (canarytest.Leaked, which does not use the detectors) checks every
// body an external (T3) upstream received for the canary.

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"io/fs"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tidwall/gjson"

	"github.com/molly-gateway/molly/internal/canarytest"
	"github.com/molly-gateway/molly/internal/upstreamtest"
	"github.com/molly-gateway/molly/policies"
	"github.com/molly-gateway/molly/redaction"
	"github.com/molly-gateway/molly/router/classify"
	"github.com/molly-gateway/molly/router/egress"
	"github.com/molly-gateway/molly/router/identity"
	"github.com/molly-gateway/molly/router/openai"
	"github.com/molly-gateway/molly/router/route"
)

// recorder is an upstream that records every body and answers like
// upstreamtest, or always 500 (fail).
type recorder struct {
	up   *upstreamtest.Upstream
	fail *httptest.Server
	mu   sync.Mutex
	got  [][]byte
}

func (r *recorder) url() string {
	if r.fail != nil {
		return r.fail.URL + "/v1"
	}
	return r.up.URL()
}

// drain returns the bodies received since the last drain.
func (r *recorder) drain() [][]byte {
	if r.up != nil {
		return r.up.Drain()
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	out := r.got
	r.got = nil
	return out
}

// canaryHarness is one gateway per strategy, all over the same upstreams.
type canaryHarness struct {
	t3       []*recorder // every external upstream: the oracle reads these
	gateways map[string]http.Handler
	tool     *echoTools
}

// echoTools is a governed tool runner whose one tool returns the record the
// fuzz planted for it (a canary in a tool result must be redacted before
// the next round goes to T3). The property under test is the pipeline's;
// real plugin processes are covered by the plugins and cmd/molly tests.
type echoTools struct {
	mu     sync.Mutex
	result string
}

func (e *echoTools) Tools() []ToolSpec {
	return []ToolSpec{{Name: "lookup", Description: "looks a customer up", Parameters: json.RawMessage(`{"type":"object"}`), SideEffect: "read"}}
}

func (e *echoTools) Invoke(_ context.Context, name string, args []byte, member string, scopes []string, key string) ([]byte, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return json.Marshal(map[string]any{"customer": e.result})
}

var (
	harnessOnce sync.Once
	harness     *canaryHarness
	harnessErr  error
)

func canaryGateways(tb testing.TB) *canaryHarness {
	tb.Helper()
	harnessOnce.Do(func() { harness, harnessErr = newCanaryHarness() })
	if harnessErr != nil {
		tb.Fatal(harnessErr)
	}
	return harness
}

func newCanaryHarness() (*canaryHarness, error) {
	h := &canaryHarness{gateways: map[string]http.Handler{}, tool: &echoTools{}}
	newUp := func(name string, logprob float64) *recorder {
		u := upstreamtest.Start(name)
		u.Logprob = logprob
		u.ToolCalls = func(body []byte) []upstreamtest.ToolCall {
			if !gjson.GetBytes(body, `tools.#(function.name=="lookup")`).Exists() || strings.Contains(string(body), `"role":"tool"`) {
				return nil
			}
			return []upstreamtest.ToolCall{{ID: "call_1", Name: "lookup", Arguments: `{"q":"x"}`}}
		}
		return &recorder{up: u}
	}
	a, b := newUp("ext-a", -3), newUp("ext-b", -0.1)
	fail := &recorder{}
	fail.fail = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		fail.mu.Lock()
		fail.got = append(fail.got, body)
		fail.mu.Unlock()
		w.WriteHeader(http.StatusInternalServerError)
	}))
	h.t3 = []*recorder{a, b, fail}

	// The default policies, except that governed tools may be offered to
	// T3 too, so the tool loop sends tool results to an external API.
	dir, err := os.MkdirTemp("", "molly-canary-policy")
	if err != nil {
		return nil, err
	}
	err = fs.WalkDir(policies.Default, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || strings.HasSuffix(p, "_test.rego") {
			return err
		}
		src, err := fs.ReadFile(policies.Default, p)
		if err != nil {
			return err
		}
		src = bytes.ReplaceAll(src, []byte(`tool_offer_denied_tiers := {"T3"}`), []byte(`tool_offer_denied_tiers := set()`))
		return os.WriteFile(filepath.Join(dir, p), src, 0o600)
	})
	if err != nil {
		return nil, err
	}
	pol, err := policies.New(context.Background(), policies.Options{Dir: dir})
	if err != nil {
		return nil, err
	}
	scanner, err := redaction.NewScanner(redaction.Config{Patterns: map[string][]string{"CANARY": {canarytest.Pattern}}})
	if err != nil {
		return nil, err
	}
	// Public classes, so that T3 is allowed and redaction is what protects
	// the canaries (a confidential class would keep them off T3 anyway).
	cl := classify.New(scanner, map[string]classify.Sensitivity{"CANARY": classify.Public, "CREDIT_CARD": classify.Public})

	target := func(name string, r *recorder, q float64) *route.Target {
		return &route.Target{Name: name, Tier: "T3", Endpoint: r.url(), Models: []string{"m"}, Quality: map[string]float64{"default": q}, PriceIn: 1, PriceOut: 1}
	}
	variants := map[string]struct {
		targets []*route.Target
		cfg     route.Config
		tools   bool
	}{
		"single":   {targets: []*route.Target{target("ext-a", a, 0.5)}},
		"fallback": {targets: []*route.Target{target("fail", fail, 0.9), target("ext-a", a, 0.5)}},
		"cascade":  {targets: []*route.Target{target("ext-a", a, 0.5), target("ext-b", b, 0.6)}, cfg: route.Config{Cascade: &route.Cascade{Threshold: -1, HoldTokens: 2}}},
		"mixture":  {targets: []*route.Target{target("ext-a", a, 0.5), target("ext-b", b, 0.6)}, cfg: route.Config{Mixture: &route.Mixture{Entropy: 0}}},
		"tools":    {targets: []*route.Target{target("ext-a", a, 0.5)}, cfg: route.Config{Tools: true}, tools: true},
	}
	for name, v := range variants {
		cat, err := route.NewCatalogue(v.targets, nil)
		if err != nil {
			return nil, err
		}
		eg, err := egress.New(cat, nil)
		if err != nil {
			return nil, err
		}
		p := &Pipeline{Catalogue: cat, Egress: eg, Policy: pol, Weights: route.DefaultWeights, Strategies: v.cfg, FirstEventTimeout: 5 * time.Second}
		if v.tools {
			p.Tools = h.tool
		}
		h.gateways[name] = gatewayHandler(cl, p)
	}
	return h, nil
}

// gatewayHandler is molly_classify → molly_policy → molly_route in process.
func gatewayHandler(cl *classify.Classifier, p *Pipeline) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ep, aerr := openai.EndpointOf(r.Method, r.URL.Path)
		if aerr != nil {
			aerr.Write(w)
			return
		}
		body, _ := io.ReadAll(r.Body)
		a, err := cl.Classify(classify.Input{Endpoint: ep, Path: r.URL.Path, Body: body})
		if err != nil {
			openai.WriteError(w, err)
			return
		}
		d := p.Decide(r.Context(), a, identity.From(r.Context()))
		if !d.Decision().Allowed() {
			PolicyError(d.Decision()).Write(w)
			return
		}
		if err := p.Serve(w, r, a, d); err != nil {
			openai.WriteError(w, err)
		}
	})
}

// runCanary sends c through its strategy's gateway and fails when any T3
// upstream received the canary, or the gateway answered 500.
func runCanary(t *testing.T, h *canaryHarness, c canarytest.Case) {
	for _, r := range h.t3 {
		r.drain()
	}
	h.tool.mu.Lock()
	h.tool.result = c.Tool
	h.tool.mu.Unlock()
	req := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", bytes.NewReader(c.Body))
	w := httptest.NewRecorder()
	h.gateways[c.Strategy].ServeHTTP(w, req)
	if w.Code == http.StatusInternalServerError {
		t.Fatalf("%s: 500 for %s: %s", c.Strategy, c.Body, w.Body.String())
	}
	for _, r := range h.t3 {
		for _, got := range r.drain() {
			if canarytest.Leaked(got, c.Canary) {
				t.Fatalf("canary %s reached T3 unredacted under %s (status %d)\nsent:     %s\nreceived: %s", c.Canary, c.Strategy, w.Code, c.Body, got)
			}
		}
	}
}

// canaryMu serialises cases: the tool result and the per-upstream counts
// are shared.
var canaryMu sync.Mutex

// FuzzCanaryResidency is the long form: `go test -fuzz FuzzCanaryResidency
// ./router/pipeline/` (make fuzz).
func FuzzCanaryResidency(f *testing.F) {
	for i := range uint64(40) {
		f.Add(i, i*7919)
	}
	f.Fuzz(func(t *testing.T, s1, s2 uint64) {
		h := canaryGateways(t)
		canaryMu.Lock()
		defer canaryMu.Unlock()
		runCanary(t, h, canarytest.Generate(rand.New(rand.NewPCG(s1, s2))))
	})
}

// TestCanaryResidency runs a bounded number of generated cases in the
// normal test run (at most 600, at most 20 s); the fuzz target runs many
// more.
func TestCanaryResidency(t *testing.T) {
	h := canaryGateways(t)
	r := rand.New(rand.NewPCG(1, 2))
	deadline := time.Now().Add(20 * time.Second)
	n := 0
	for ; n < 600 && time.Now().Before(deadline); n++ {
		func() {
			canaryMu.Lock()
			defer canaryMu.Unlock()
			runCanary(t, h, canarytest.Generate(r))
		}()
	}
	t.Logf("%d cases, no canary reached T3", n)
}
