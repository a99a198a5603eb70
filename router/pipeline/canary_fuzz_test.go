package pipeline

// The residency canary fuzz (issue 9): canary values — a user-defined
// pattern type and a known test card number — are planted at random
// positions and in random shapes of valid OpenAI bodies, the bodies go
// through the real classifier, the real OPA policy and the real pipeline
// under every strategy, and the oracle checks every body an external (T3)
// upstream received for the canary. The oracle does not use the detectors:
// it decodes the received JSON with encoding/json, decodes base64 and
// percent-encoding itself, and searches the alphanumeric skeleton of every
// string, key and number for the canary's.

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tidwall/gjson"

	"github.com/molly-gateway/molly/internal/upstreamtest"
	"github.com/molly-gateway/molly/policies"
	"github.com/molly-gateway/molly/redaction"
	"github.com/molly-gateway/molly/router/classify"
	"github.com/molly-gateway/molly/router/egress"
	"github.com/molly-gateway/molly/router/identity"
	"github.com/molly-gateway/molly/router/openai"
	"github.com/molly-gateway/molly/router/route"
)

// canaryCard is the Visa test card number issuers publish for testing.
const canaryCard = "4111111111111111"

// canaryPattern is the custom pattern type the fuzz classifier detects.
const canaryPattern = `MOLLY-CANARY-[0-9A-F]{8}`

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
	scanner, err := redaction.NewScanner(redaction.Config{Patterns: map[string][]string{"CANARY": {canaryPattern}}})
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

// canaryCase is one generated request.
type canaryCase struct {
	strategy string
	body     []byte
	canary   string // what must never reach T3: its alphanumeric skeleton
	tool     string // the tool result, for the tools strategy
}

var strategies = []string{"single", "fallback", "cascade", "mixture", "tools"}

// genCase builds a valid chat body from r with one canary planted.
func genCase(r *rand.Rand) canaryCase {
	c := canaryCase{strategy: strategies[r.IntN(len(strategies))]}
	var value string
	if r.IntN(2) == 0 {
		value = fmt.Sprintf("MOLLY-CANARY-%08X", r.Uint32())
	} else {
		value = []string{canaryCard, "4111 1111 1111 1111", "4111-1111-1111-1111"}[r.IntN(3)]
	}
	c.canary = skeleton(value)
	wrap := func(s string) string { // the canary inside some text
		return []string{s, "my value is " + s + ".", "ref:" + s, s + " thanks", "a\n" + s + "\nb"}[r.IntN(5)]
	}
	msgs := []any{map[string]any{"role": "user", "content": "hello there"}}
	body := map[string]any{"model": "m", "messages": msgs, "max_tokens": 16}
	stream := r.IntN(3) == 0 && c.strategy != "mixture" && c.strategy != "tools"
	if stream {
		body["stream"] = true
	}
	user := func(content any) { msgs = append(msgs, map[string]any{"role": "user", "content": content}) }
	switch pos := r.IntN(20); pos {
	case 0:
		user(wrap(value))
	case 1:
		user([]any{map[string]any{"type": "text", "text": wrap(value)}})
	case 2:
		msgs = append([]any{map[string]any{"role": "system", "content": wrap(value)}}, msgs...)
	case 3:
		msgs = append(msgs, map[string]any{"role": "assistant", "content": wrap(value)}, map[string]any{"role": "user", "content": "and?"})
	case 4:
		msgs = append(msgs, map[string]any{"role": "user", "name": strings.ReplaceAll(value, " ", "_"), "content": "hi"})
	case 5:
		body["metadata"] = map[string]any{"ref": wrap(value)}
	case 6:
		body["metadata"] = map[string]any{value: "x"}
	case 7:
		body["user"] = wrap(value)
	case 8:
		body["stop"] = []any{"END", wrap(value)}
	case 9:
		body["response_format"] = map[string]any{"type": "json_schema", "json_schema": map[string]any{"name": "out", "description": wrap(value),
			"schema": map[string]any{"type": "object", "properties": map[string]any{value: map[string]any{"type": "string"}}}}}
	case 10:
		args, _ := json.Marshal(map[string]any{"note": wrap(value)})
		msgs = append(msgs, map[string]any{"role": "assistant", "content": nil, "tool_calls": []any{map[string]any{"id": "call_9", "type": "function",
			"function": map[string]any{"name": "f", "arguments": string(args)}}}}, map[string]any{"role": "tool", "tool_call_id": "call_9", "content": "done"})
	case 11:
		id := "call_" + strings.ReplaceAll(value, " ", "")
		msgs = append(msgs, map[string]any{"role": "assistant", "content": nil, "tool_calls": []any{map[string]any{"id": id, "type": "function",
			"function": map[string]any{"name": "f", "arguments": "{}"}}}}, map[string]any{"role": "tool", "tool_call_id": id, "content": wrap(value)})
	case 12:
		body["x_vendor"] = map[string]any{"deep": []any{map[string]any{"deeper": wrap(value)}}}
	case 13:
		if v := strings.ReplaceAll(value, " ", ""); !strings.Contains(v, "-") {
			body["seed"] = json.Number(v) // a number, not a string
		} else {
			body["seed_note"] = v
		}
	case 14:
		enc := base64.StdEncoding.EncodeToString([]byte("note: " + value))
		user([]any{map[string]any{"type": "text", "text": "see"}, map[string]any{"type": "image_url", "image_url": map[string]any{"url": "data:text/plain;base64," + enc}}})
	case 15:
		png := append([]byte("\x89PNG\r\n\x1a\n"), []byte(value)...)
		user([]any{map[string]any{"type": "text", "text": "look"}, map[string]any{"type": "image_url", "image_url": map[string]any{"url": "data:image/png;base64," + base64.StdEncoding.EncodeToString(png)}}})
	case 16:
		body["tool_choice"] = value // not one of the enum's values: content
	case 17:
		cut := len(value) / 2
		user(value[:cut])
		user(value[cut:])
	case 18:
		body["tools"] = []any{map[string]any{"type": "function", "function": map[string]any{"name": "g", "description": wrap(value), "parameters": map[string]any{"type": "object"}}}}
	case 19:
		c.tool = wrap(value)
		c.strategy = "tools"
	}
	if c.strategy == "tools" && c.tool == "" {
		c.tool = "nothing to see"
	}
	body["messages"] = msgs
	c.body, _ = json.Marshal(body)
	return c
}

// skeleton is s's letters and digits, upper-cased: the oracle's canonical form.
func skeleton(s string) string {
	var b strings.Builder
	for _, r := range strings.ToUpper(s) {
		if r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' {
			b.WriteRune(r)
		}
	}
	return b.String()
}

// leaked reports whether body (as an upstream received it) carries the
// canary: in any string, key or number, raw, percent-decoded or
// base64-decoded (a data: URL's payload or any base64 run).
func leaked(body []byte, canary string) bool {
	if strings.Contains(skeleton(string(body)), canary) {
		// fast path on the raw bytes; JSON escapes are handled below
		return true
	}
	var v any
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	if dec.Decode(&v) != nil {
		return false
	}
	var texts []string
	var walk func(any)
	walk = func(x any) {
		switch t := x.(type) {
		case map[string]any:
			for k, e := range t {
				texts = append(texts, k)
				walk(e)
			}
		case []any:
			for _, e := range t {
				walk(e)
			}
		case string:
			texts = append(texts, t)
		case json.Number:
			texts = append(texts, string(t))
		}
	}
	walk(v)
	for _, s := range texts {
		forms := []string{s}
		if u, err := url.PathUnescape(s); err == nil {
			forms = append(forms, u)
		}
		if _, payload, ok := strings.Cut(s, ";base64,"); ok {
			if d, err := base64.StdEncoding.DecodeString(payload); err == nil {
				forms = append(forms, string(d))
			}
		}
		if d, err := base64.StdEncoding.DecodeString(s); err == nil {
			forms = append(forms, string(d))
		}
		for _, f := range forms {
			if strings.Contains(skeleton(f), canary) {
				return true
			}
		}
	}
	return false
}

// runCanary sends c through its strategy's gateway and fails when any T3
// upstream received the canary, or the gateway answered 500.
func runCanary(t *testing.T, h *canaryHarness, c canaryCase) {
	for _, r := range h.t3 {
		r.drain()
	}
	h.tool.mu.Lock()
	h.tool.result = c.tool
	h.tool.mu.Unlock()
	req := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", bytes.NewReader(c.body))
	w := httptest.NewRecorder()
	h.gateways[c.strategy].ServeHTTP(w, req)
	if w.Code == http.StatusInternalServerError {
		t.Fatalf("%s: 500 for %s: %s", c.strategy, c.body, w.Body.String())
	}
	for _, r := range h.t3 {
		for _, got := range r.drain() {
			if leaked(got, c.canary) {
				t.Fatalf("canary %s reached T3 unredacted under %s (status %d)\nsent:     %s\nreceived: %s", c.canary, c.strategy, w.Code, c.body, got)
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
		runCanary(t, h, genCase(rand.New(rand.NewPCG(s1, s2))))
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
			runCanary(t, h, genCase(r))
		}()
	}
	t.Logf("%d cases, no canary reached T3", n)
}

// TestCanaryOracleSeesEveryForm checks the oracle itself: it finds the
// canary in each shape it may take in a received body, and not in a
// redacted one.
func TestCanaryOracleSeesEveryForm(t *testing.T) {
	canary := skeleton("MOLLY-CANARY-0A1B2C3D")
	for _, body := range []string{
		`{"a":"MOLLY-CANARY-0A1B2C3D"}`,
		`{"a":"MOLLY\u002dCANARY\u002d0A1B2C3D"}`,
		`{"MOLLY-CANARY-0A1B2C3D":1}`,
		`{"a":"data:text/plain;base64,` + base64.StdEncoding.EncodeToString([]byte("x MOLLY-CANARY-0A1B2C3D")) + `"}`,
		`{"a":"MOLLY%2DCANARY%2D0A1B2C3D"}`,
	} {
		if !leaked([]byte(body), canary) {
			t.Errorf("the oracle misses the canary in %s", body)
		}
	}
	if leaked([]byte(`{"a":"[CANARY_1]","b":"[CREDIT_CARD_1]"}`), canary) || leaked([]byte(`{"seed":"[CREDIT_CARD_1]"}`), skeleton(canaryCard)) {
		t.Error("the oracle flags a redacted body")
	}
	if !leaked([]byte(`{"seed":4111111111111111}`), skeleton(canaryCard)) {
		t.Error("the oracle misses a card number sent as a JSON number")
	}
}
